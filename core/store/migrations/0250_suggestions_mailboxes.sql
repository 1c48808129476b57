-- The calendar's detectors read the person's mailboxes (Gmail with the read scope, IMAP): a mailbox
-- connected (or a Google grant changed) marks the account, so its detectors run soon and the
-- account gets a suggestion_runs row, which the hourly look at remote sources needs.
CREATE TRIGGER connections_suggestions AFTER INSERT OR UPDATE OF scopes ON connections
    FOR EACH ROW WHEN (NEW.provider IN ('imap', 'google'))
    EXECUTE FUNCTION suggestions_dirty();
