-- Every checked answer to "prove who you are" on a call, and every one-time code texted, kept
-- across calls: the PIN path locks on wrong answers per account and per calling number over a
-- sliding hour (not only on calls that reached their own limit), and code sends are capped per
-- account per hour. What was tried is never stored, only that a try failed.
CREATE TABLE call_verification_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    source      text,                 -- E.164 of the calling number
    call_sid    text,
    kind        text NOT NULL CHECK (kind IN ('pin-wrong', 'code-wrong', 'code-sent', 'pin-locked')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX call_verification_attempts_account ON call_verification_attempts (account_id, kind, created_at);
CREATE INDEX call_verification_attempts_source ON call_verification_attempts (source, kind, created_at);
