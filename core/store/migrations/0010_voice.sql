-- Phone calls: one-time Media Stream tokens and a record of each call.

-- A token handed to Twilio in <Parameter name="call_token"> and checked once on the media socket.
-- Only its SHA-256 is stored; it is bound to one CallSid, short-lived and single use.
CREATE TABLE call_stream_tokens (
    token_hash  bytea PRIMARY KEY,
    call_sid    text NOT NULL,
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX call_stream_tokens_expiry ON call_stream_tokens (expires_at);

-- One row per call Pepper answered or refused. The transcript itself lives in messages.
CREATE TABLE calls (
    call_sid        text PRIMARY KEY,
    account_id      uuid REFERENCES accounts (id) ON DELETE CASCADE,
    line_number     text,
    caller          text,                 -- E.164 of a known caller (for the one-time code); else NULL
    handle_id       uuid REFERENCES handles (id) ON DELETE SET NULL,
    route           text NOT NULL CHECK (route IN ('owner', 'answering', 'refused', 'blocked')),
    status          text NOT NULL DEFAULT 'ringing',
    turn_id         uuid REFERENCES turns (id) ON DELETE SET NULL,
    verified_by     text,
    end_reason      text,
    summary         text,
    stats           jsonb NOT NULL DEFAULT '{}',
    started_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);
CREATE INDEX calls_account_started ON calls (account_id, started_at);
