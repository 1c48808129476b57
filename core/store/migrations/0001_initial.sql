-- Identity, the one conversation per person, and the record of every turn.

CREATE EXTENSION IF NOT EXISTS vector;

-- A person. The account is the identity; handles only point to it.
CREATE TABLE accounts (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL CHECK (length(btrim(name)) > 0),
    timezone    text NOT NULL DEFAULT 'UTC',
    pin_hash    text,                 -- argon2id; NULL until the owner sets a PIN
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- A phone number (E.164), an email address (lower-cased) or a web login that points to an account.
CREATE TABLE handles (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind         text NOT NULL CHECK (kind IN ('phone', 'email', 'web')),
    value        text NOT NULL,
    verified_at  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, value)
);
CREATE INDEX handles_account ON handles (account_id);

-- Per-channel consent of a handle. No row means the handle has not opted out.
CREATE TABLE handle_consents (
    handle_id   uuid NOT NULL REFERENCES handles (id) ON DELETE CASCADE,
    channel     text NOT NULL CHECK (channel IN ('sms', 'whatsapp', 'voice', 'email')),
    opted_out   boolean NOT NULL,
    source      text NOT NULL,        -- what changed it: a keyword, OptOutType, the admin CLI
    changed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (handle_id, channel)
);

-- The Twilio numbers Pepper answers, each tied to the account it serves.
CREATE TABLE phone_lines (
    number      text PRIMARY KEY,     -- E.164
    kind        text NOT NULL CHECK (kind IN ('personal', 'answering')),
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    label       text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX phone_lines_account ON phone_lines (account_id);

-- One conversation per account, across every channel.
CREATE TABLE conversations (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id  uuid NOT NULL UNIQUE REFERENCES accounts (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Everything about one turn, filled in as the turn runs. Later features add to the JSON parts.
CREATE TABLE turns (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    conversation_id   uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    kind              text NOT NULL DEFAULT 'live' CHECK (kind IN ('live', 'scheduled', 'room', 'call', 'replay')),
    channel           text NOT NULL,
    status            text NOT NULL DEFAULT 'running'
                      CHECK (status IN ('running', 'replied', 'delivered', 'failed', 'abandoned')),
    model             text,
    tier              text,
    prompt            jsonb,
    rounds            jsonb NOT NULL DEFAULT '[]',
    tool_calls        jsonb NOT NULL DEFAULT '[]',
    gate_decisions    jsonb NOT NULL DEFAULT '[]',
    staged_writes     jsonb NOT NULL DEFAULT '[]',
    committed_writes  jsonb NOT NULL DEFAULT '[]',
    usage             jsonb,
    timings           jsonb,
    delivery          jsonb,
    error             text,
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    delivered_at      timestamptz
);
CREATE INDEX turns_conversation_started ON turns (conversation_id, started_at);

-- Every message in and out. A provider's id is unique per channel, so a retried webhook
-- delivery finds its message already recorded and starts no second turn.
CREATE TABLE messages (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id      uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    handle_id            uuid REFERENCES handles (id) ON DELETE SET NULL,
    channel              text NOT NULL
                         CHECK (channel IN ('sms', 'whatsapp', 'voice', 'web', 'email', 'cli', 'answering')),
    direction            text NOT NULL CHECK (direction IN ('inbound', 'outbound')),
    provider_message_id  text,
    body                 text NOT NULL,
    turn_id              uuid REFERENCES turns (id) ON DELETE SET NULL,
    delivery_status      text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (channel, provider_message_id)
);
CREATE INDEX messages_conversation_created ON messages (conversation_id, created_at);

-- Refused requests (forged signatures, reused stream tokens): what happened, never the content.
CREATE TABLE security_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL,
    detail      jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
