-- Keys Pepper pressed on a call it placed (send_digits, voice.digits): the model asks, the media
-- stream closes, and Twilio's <Connect action> request plays them (<Play digits>) before a new
-- stream on the same call. A row is played at most once; at most one waits per call. ``context``:
-- the call's transcript so far (caller and Pepper lines), carried to the new stream's model.
CREATE TABLE call_digits (
    id              bigserial PRIMARY KEY,
    call_sid        text NOT NULL,
    account_id      uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    digits          text NOT NULL CHECK (digits ~ '^[0-9*#w]{1,32}$'),
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'played')),
    context         jsonb NOT NULL DEFAULT '[]',
    requested_at    timestamptz NOT NULL DEFAULT now(),
    played_at       timestamptz
);

CREATE UNIQUE INDEX call_digits_one_pending ON call_digits (call_sid) WHERE status = 'pending';
CREATE INDEX call_digits_by_call ON call_digits (call_sid, id);
