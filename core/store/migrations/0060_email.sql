-- The email channel: the signing tokens of inbound mail webhooks already accepted, so a replayed
-- request is refused even after a restart or when it reaches another process. Tokens older than
-- the accepted age of a webhook are pruned as new ones arrive (a stale timestamp is refused anyway).
CREATE TABLE email_webhook_tokens (
    token    text PRIMARY KEY,
    seen_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX email_webhook_tokens_seen ON email_webhook_tokens (seen_at);
