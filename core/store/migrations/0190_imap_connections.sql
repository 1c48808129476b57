-- A mailbox the person connects over IMAP (`pepper connect imap`): a connection of provider
-- 'imap', label: the account name the person gave, config: host, port, user, security; the
-- password sealed like every other secret.
ALTER TABLE connections DROP CONSTRAINT connections_provider_check;
ALTER TABLE connections ADD CONSTRAINT connections_provider_check
    CHECK (provider IN ('google', 'caldav', 'mcp', 'imap'));
