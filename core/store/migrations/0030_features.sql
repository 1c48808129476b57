-- Feature areas: connections, calendar, email, contacts, documents, feeds.

CREATE EXTENSION IF NOT EXISTS btree_gist;

-- An outside account the person connected (Google, a CalDAV server). ``scopes`` are exactly the
-- OAuth scopes granted; ``secret`` holds tokens or a password and is never logged or shown.
CREATE TABLE connections (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    provider    text NOT NULL CHECK (provider IN ('google', 'caldav')),
    label       text NOT NULL DEFAULT '',
    config      jsonb NOT NULL DEFAULT '{}',
    secret      jsonb NOT NULL DEFAULT '{}',
    scopes      text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, provider, label)
);

-- Every calendar Pepper reads for a person: its own, CalDAV collections, Google calendars and
-- read-only iCalendar feeds. ``counts_busy``: whether its events block time in free/busy.
CREATE TABLE calendars (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id     uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind           text NOT NULL CHECK (kind IN ('pepper', 'caldav', 'google', 'ical')),
    name           text NOT NULL,
    connection_id  uuid REFERENCES connections (id) ON DELETE CASCADE,
    remote         text,                  -- collection URL, Google calendar id or feed URL
    read_only      boolean NOT NULL DEFAULT false,
    counts_busy    boolean NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX calendars_one_pepper ON calendars (account_id) WHERE kind = 'pepper';
CREATE UNIQUE INDEX calendars_remote ON calendars (account_id, kind, remote) WHERE remote IS NOT NULL;

-- Events of Pepper's own calendar. Times are instants; ``tzid`` is the zone the event was made
-- in, which recurrence follows (09:00 stays 09:00 across a DST change). A recurring series has
-- ``rrule`` (RFC 5545) and ``series_until`` (end of its last occurrence, NULL when endless);
-- ``exdates`` are the original starts of occurrences cancelled or moved out of the series.
CREATE TABLE calendar_events (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    calendar_id   uuid NOT NULL REFERENCES calendars (id) ON DELETE CASCADE,
    uid           text NOT NULL,
    title         text NOT NULL,
    location      text,
    description   text,
    starts_at     timestamptz NOT NULL,
    ends_at       timestamptz NOT NULL CHECK (ends_at > starts_at),
    tzid          text NOT NULL DEFAULT 'UTC',
    rrule         text,
    series_until  timestamptz,
    exdates       timestamptz[] NOT NULL DEFAULT '{}',
    series_id     uuid REFERENCES calendar_events (id) ON DELETE CASCADE,
    recurrence_of timestamptz,            -- for a moved occurrence: its original start
    attendees     jsonb NOT NULL DEFAULT '[]',
    busy          boolean NOT NULL DEFAULT true,
    status        text NOT NULL DEFAULT 'confirmed' CHECK (status IN ('confirmed', 'cancelled')),
    booking_key   text,
    sequence      integer NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX calendar_events_single ON calendar_events USING gist (account_id, tstzrange(starts_at, ends_at))
    WHERE rrule IS NULL AND status = 'confirmed';
CREATE INDEX calendar_events_series ON calendar_events (account_id, starts_at)
    WHERE rrule IS NOT NULL AND status = 'confirmed';
CREATE UNIQUE INDEX calendar_events_booking ON calendar_events (account_id, booking_key)
    WHERE booking_key IS NOT NULL;

-- Contacts: the addresses Pepper may send to besides the person's own handles.
CREATE TABLE contacts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (length(btrim(name)) > 0),
    emails      text[] NOT NULL DEFAULT '{}',   -- lower-cased
    phones      text[] NOT NULL DEFAULT '{}',   -- E.164
    notes       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX contacts_account ON contacts (account_id, lower(name));
CREATE INDEX contacts_emails ON contacts USING gin (emails);

-- Mail Pepper sent or drafted. A draft is shown in chat as a card (``card``) to review and send.
-- ``dedupe_key`` makes a retried send go out once.
CREATE TABLE email_messages (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    sender        text NOT NULL CHECK (sender IN ('pepper', 'gmail')),
    from_address  text NOT NULL,
    to_addresses  text[] NOT NULL,
    cc_addresses  text[] NOT NULL DEFAULT '{}',
    subject       text NOT NULL,
    body          text NOT NULL,
    status        text NOT NULL CHECK (status IN ('draft', 'sent', 'discarded')),
    remote_id     text,                 -- Gmail draft or message id
    message_id    text,                 -- RFC 5322 Message-ID of a sent mail
    card          jsonb,
    dedupe_key    text,
    turn_id       uuid REFERENCES turns (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz
);
CREATE INDEX email_messages_account ON email_messages (account_id, created_at);
CREATE UNIQUE INDEX email_messages_dedupe ON email_messages (account_id, dedupe_key) WHERE dedupe_key IS NOT NULL;

-- Documents extend notes: a note with a title is a document Pepper or the person wrote.
ALTER TABLE notes
    ADD COLUMN title      text,
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
CREATE UNIQUE INDEX notes_document_title ON notes (account_id, lower(title)) WHERE title IS NOT NULL;

-- Feeds (RSS/Atom) and their items. Reading an item marks it read only once the reply that
-- showed it was delivered (a staged write).
CREATE TABLE feeds (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id     uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    url            text NOT NULL,
    title          text NOT NULL DEFAULT '',
    etag           text,
    modified       text,
    last_fetched   timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, url)
);
CREATE TABLE feed_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    feed_id     bigint NOT NULL REFERENCES feeds (id) ON DELETE CASCADE,
    guid        text NOT NULL,
    title       text NOT NULL,
    link        text,
    summary     text NOT NULL DEFAULT '',
    published   timestamptz,
    read_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (feed_id, guid)
);
CREATE INDEX feed_items_unread ON feed_items (feed_id, id) WHERE read_at IS NULL;
