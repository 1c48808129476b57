-- Calendar detectors' suggestions (core/suggestions): one row per thing a detector found, keyed
-- by a stable key so a run that finds it again neither duplicates it nor brings back a dismissed
-- one. ``state``: 'shadow' (the detector is in shadow: recorded, never shown), 'open' (a card),
-- 'accepting' (an accept is running its action), 'accepted', 'dismissed', 'gone' (a later run no
-- longer found it: the clash was resolved, the event was added).
CREATE TABLE suggestions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    detector     text NOT NULL,
    key          text NOT NULL,
    title        text NOT NULL,
    detail       text NOT NULL DEFAULT '',
    action       jsonb,               -- {"tool": NAME, "arguments": {...}}; null: nothing to run
    state        text NOT NULL CHECK (state IN ('shadow', 'open', 'accepting', 'accepted', 'dismissed', 'gone')),
    result       text,                -- what the accept came to, or why it was refused
    created_at   timestamptz NOT NULL DEFAULT now(),
    seen_at      timestamptz NOT NULL DEFAULT now(),
    decided_at   timestamptz,
    UNIQUE (account_id, detector, key)
);
CREATE INDEX suggestions_open ON suggestions (account_id, created_at) WHERE state = 'open';

-- Which accounts' calendars, todos, notes or inbound mail changed since their detectors last ran.
CREATE TABLE suggestion_runs (
    account_id   uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    dirty_at     timestamptz,
    ran_at       timestamptz,
    lease_owner  text,
    lease_until  timestamptz
);

CREATE FUNCTION suggestions_dirty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO suggestion_runs (account_id, dirty_at) VALUES (NEW.account_id, now())
    ON CONFLICT (account_id) DO UPDATE SET dirty_at = now();
    RETURN NULL;
END $$;

CREATE FUNCTION suggestions_dirty_mail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.channel = 'email' AND NEW.direction = 'inbound' THEN
        INSERT INTO suggestion_runs (account_id, dirty_at)
        SELECT c.account_id, now() FROM conversations c WHERE c.id = NEW.conversation_id
        ON CONFLICT (account_id) DO UPDATE SET dirty_at = now();
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER calendar_events_suggestions AFTER INSERT OR UPDATE ON calendar_events
    FOR EACH ROW EXECUTE FUNCTION suggestions_dirty();
CREATE TRIGGER calendars_suggestions AFTER INSERT ON calendars
    FOR EACH ROW EXECUTE FUNCTION suggestions_dirty();
CREATE TRIGGER todos_suggestions AFTER INSERT OR UPDATE ON todos
    FOR EACH ROW EXECUTE FUNCTION suggestions_dirty();
CREATE TRIGGER notes_suggestions AFTER INSERT OR UPDATE ON notes
    FOR EACH ROW EXECUTE FUNCTION suggestions_dirty();
CREATE TRIGGER messages_suggestions AFTER INSERT ON messages
    FOR EACH ROW EXECUTE FUNCTION suggestions_dirty_mail();

-- Places (core/tools/areas/places): addresses a person saved with their coordinates, and
-- addresses a geocoding service placed (kept so the service is asked once per address).
CREATE TABLE places (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name        text NOT NULL,          -- lower-cased, spaces folded: what a location is matched by
    label       text NOT NULL,          -- as the person or the service wrote it
    lat         double precision NOT NULL CHECK (lat BETWEEN -90 AND 90),
    lon         double precision NOT NULL CHECK (lon BETWEEN -180 AND 180),
    source      text NOT NULL CHECK (source IN ('saved', 'geocoded')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, name)
);
