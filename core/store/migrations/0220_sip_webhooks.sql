-- SIP direct (voice/sip.py): each OpenAI webhook Pepper acted on, by its webhook-id, so a
-- redelivered webhook (standard-webhooks retries on any non-2xx or timeout) starts no second call.
CREATE TABLE sip_webhooks (
    webhook_id text PRIMARY KEY,
    session_id text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sip_webhooks_received_at ON sip_webhooks (received_at);
