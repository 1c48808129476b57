-- Every checked answer to "prove who you are" on a call, and every one-time code texted, kept
-- across calls: the PIN path locks on wrong answers per account and per calling number over a
-- sliding hour (not only on calls that reached their own limit), and code sends are capped per
-- account per hour. What was tried is never stored, only that a try failed.
--
-- Each count is kept apart for calls whose number the originating carrier vouched for (SHAKEN/STIR
-- attestation A, Twilio's StirVerstat TN-Validation-Passed-A) and the others: a caller spoofing
-- the owner's number gets no A, so their failures and code requests never lock out or use up the
-- owner calling from their own phone.
ALTER TABLE calls ADD COLUMN attested boolean NOT NULL DEFAULT false;

CREATE TABLE call_verification_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    source      text,                 -- E.164 of the calling number
    call_sid    text,
    kind        text NOT NULL CHECK (kind IN ('pin-wrong', 'code-wrong', 'code-sent', 'pin-locked')),
    attested    boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX call_verification_attempts_account ON call_verification_attempts (account_id, kind, created_at);
CREATE INDEX call_verification_attempts_source ON call_verification_attempts (source, kind, created_at);
