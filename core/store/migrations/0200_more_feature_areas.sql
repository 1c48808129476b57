-- More feature areas: lists (shopping, packing), texts Pepper sends for the person, the place
-- weather forecasts are for, and Home Assistant connections.

-- A list belongs to one person; ``room_id`` set: shared with that room (its members' room turns
-- read and change it). Names are unique per owner, case-insensitively.
CREATE TABLE lists (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 80),
    room_id     uuid REFERENCES rooms (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX lists_name ON lists (account_id, lower(name));
CREATE INDEX lists_room ON lists (room_id) WHERE room_id IS NOT NULL;

CREATE TABLE list_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id     bigint NOT NULL REFERENCES lists (id) ON DELETE CASCADE,
    text        text NOT NULL CHECK (length(text) BETWEEN 1 AND 300),
    done_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- The same open item once per list: adding "milk" twice keeps one.
CREATE UNIQUE INDEX list_items_open ON list_items (list_id, lower(text)) WHERE done_at IS NULL;

-- A text (SMS or WhatsApp) Pepper sends for the person from their line. ``key`` makes a repeated
-- apply (a retried delivery report) one send: it is the staged write's turn and content.
CREATE TABLE outbound_texts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    key          text NOT NULL UNIQUE,
    channel      text NOT NULL CHECK (channel IN ('sms', 'whatsapp')),
    to_number    text NOT NULL,
    from_number  text NOT NULL,
    contact      text NOT NULL,
    body         text NOT NULL,
    status       text NOT NULL CHECK (status IN ('draft', 'queued', 'sent', 'delivered', 'failed', 'discarded')),
    sid          text,
    error        text,
    turn_id      uuid REFERENCES turns (id) ON DELETE SET NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz
);
CREATE INDEX outbound_texts_account ON outbound_texts (account_id, id);
CREATE UNIQUE INDEX outbound_texts_sid ON outbound_texts (sid) WHERE sid IS NOT NULL;

-- Numbers that texted STOP to one of Pepper's lines without being anyone's handle: nothing is
-- sent to them until they text START.
CREATE TABLE text_opt_outs (
    number      text PRIMARY KEY,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

-- Where the person's weather forecasts are for (a geocoded place).
CREATE TABLE weather_places (
    account_id  uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    name        text NOT NULL,
    latitude    double precision NOT NULL CHECK (latitude BETWEEN -90 AND 90),
    longitude   double precision NOT NULL CHECK (longitude BETWEEN -180 AND 180),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The topics the person's news is filtered by (words matched in feed items' titles and summaries).
CREATE TABLE news_topics (
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    topic       text NOT NULL CHECK (length(topic) BETWEEN 1 AND 60),
    PRIMARY KEY (account_id, topic)
);

ALTER TABLE connections DROP CONSTRAINT connections_provider_check;
ALTER TABLE connections ADD CONSTRAINT connections_provider_check
    CHECK (provider IN ('google', 'caldav', 'mcp', 'imap', 'home_assistant'));
