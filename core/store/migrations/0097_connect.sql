-- Connecting accounts: secrets sealed at rest, and the pending OAuth consents.

-- ``sealed`` is the Fernet token (core.vault) of what ``secret`` held in plaintext. A row written
-- before this migration keeps its plaintext until the first start with a key seals it
-- (core.tools.connectors.seal_plaintext_secrets, run at start-up and on read); then ``secret``
-- is emptied. SQL alone cannot seal: the key is the server's, never the database's.
ALTER TABLE connections ADD COLUMN sealed bytea;
ALTER TABLE connections ADD CONSTRAINT connections_sealed_or_plain CHECK (sealed IS NULL OR secret = '{}');

-- A Google consent Pepper is waiting for. Only the SHA-256 of ``state`` is kept; the row is
-- deleted when the callback uses it (single use) and is void after ``expires_at``. A consent
-- started on the web page is bound to that browser session (``session_hash``) and to a cookie
-- set on the browser that started it (``browser_hash``); one started by ``pepper connect`` has
-- neither and is bound to the account only.
CREATE TABLE oauth_states (
    state_hash     bytea PRIMARY KEY,
    account_id     uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    provider       text NOT NULL CHECK (provider IN ('google')),
    features       text[] NOT NULL,
    redirect_uri   text NOT NULL,
    code_verifier  text NOT NULL,         -- PKCE (RFC 7636)
    session_hash   bytea,
    browser_hash   bytea,
    expires_at     timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX oauth_states_expiry ON oauth_states (expires_at);
