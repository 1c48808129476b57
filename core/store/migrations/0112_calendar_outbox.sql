-- What a calendar write does outside the database (a change on a CalDAV server or Google Calendar,
-- an invitation, update or cancellation by Pepper's mail) is an outbox row first: 'queued' commits
-- with the change to Pepper's own calendar, before anything leaves; 'sending' while it is under
-- way (a mail with its Message-ID); then 'sent'. One that surely did not leave is 'unsent'; one
-- that may have left but was not confirmed (the connection broke) stays 'failed' as the record of
-- it. changed_at: when the change on a CalDAV calendar was made, before its mail went.
CREATE TABLE calendar_outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    effect_key   text NOT NULL,
    tool         text NOT NULL,
    effect       text NOT NULL CHECK (effect IN ('mail', 'caldav', 'google')),
    payload      jsonb NOT NULL,
    status       text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'sending', 'sent', 'unsent', 'failed')),
    message_id   text,
    error        text,
    changed_at   timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    done_at      timestamptz,
    UNIQUE (account_id, effect_key)
);
