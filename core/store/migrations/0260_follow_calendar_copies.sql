-- Followed events copied into the person's own Google or CalDAV calendar, when a source opts in
-- (core/following/copies.py). Each copy is mapped to its remote event (the id is chosen by Pepper,
-- so a retry after a lost answer finds the same event and never makes a second one). A copy whose
-- follow or event is gone keeps its row (follow_id / event_id NULL) until the remote event is deleted.

ALTER TABLE follows
    ADD COLUMN write_calendar_id uuid REFERENCES calendars (id) ON DELETE SET NULL,  -- NULL: the primary connected one
    ADD COLUMN copy_failures integer NOT NULL DEFAULT 0,  -- checks in a row whose calendar writes failed
    ADD COLUMN copy_error text;                           -- the last such failure, said in words

ALTER TABLE follow_checks ADD COLUMN calendar_error text;  -- the check's calendar writes failed: why

CREATE TABLE follow_copies (
    id           bigserial PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    follow_id    bigint REFERENCES follows (id) ON DELETE SET NULL,
    event_id     bigint REFERENCES followed_events (id) ON DELETE SET NULL,
    calendar_id  uuid NOT NULL REFERENCES calendars (id) ON DELETE CASCADE,
    remote_id    text NOT NULL,          -- the Google event id, or the CalDAV UID (its resource name)
    written      text,                   -- what was last written (title, times, place); NULL: not yet
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (calendar_id, remote_id)
);
CREATE UNIQUE INDEX follow_copies_one ON follow_copies (event_id, calendar_id) WHERE event_id IS NOT NULL;
CREATE INDEX follow_copies_of ON follow_copies (follow_id);
CREATE INDEX follow_copies_orphans ON follow_copies (id) WHERE follow_id IS NULL OR event_id IS NULL;
