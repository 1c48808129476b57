-- Rooms (docs/rooms.md): shared chats on a Matrix homeserver where Pepper is a member.

-- A Matrix ID is a handle like a phone number: verified by a code Pepper sends to it in a direct message.
ALTER TABLE handles DROP CONSTRAINT handles_kind_check;
ALTER TABLE handles ADD CONSTRAINT handles_kind_check CHECK (kind IN ('phone', 'email', 'web', 'matrix'));

-- The code sent to an unverified Matrix handle (argon2id of it), until it is entered or expires.
CREATE TABLE matrix_link_codes (
    handle_id   uuid PRIMARY KEY REFERENCES handles (id) ON DELETE CASCADE,
    code_hash   text NOT NULL,
    dm_room     text NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Where Pepper's /sync stands for its Matrix user: it resumes from next_batch after a restart.
CREATE TABLE matrix_sync (
    user_id     text PRIMARY KEY,
    next_batch  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rooms (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    matrix_id   text NOT NULL UNIQUE,        -- !opaque:server
    name        text NOT NULL CHECK (length(btrim(name)) > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The Pepper accounts that are members of a room (their Matrix ID: their verified matrix handle).
CREATE TABLE room_members (
    room_id     uuid NOT NULL REFERENCES rooms (id) ON DELETE CASCADE,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (room_id, account_id)
);

-- Every text message in a followed room, once (event ids are unique on the homeserver).
-- handling: 'skipped' (Pepper does not speak: the reason says why), 'queued' (a turn is due),
-- 'answered'. sender is the homeserver's sender field, account_id the member it maps to (NULL: not
-- a member: another agent, a bot, a guest).
CREATE TABLE room_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    room_id     uuid NOT NULL REFERENCES rooms (id) ON DELETE CASCADE,
    event_id    text NOT NULL UNIQUE,
    sender      text NOT NULL,
    account_id  uuid REFERENCES accounts (id) ON DELETE SET NULL,
    body        text NOT NULL,
    sent_at     timestamptz NOT NULL,
    from_pepper boolean NOT NULL DEFAULT false,
    reply_to    text,
    handling    text NOT NULL CHECK (handling IN ('skipped', 'queued', 'answered')),
    reason      text,
    turn_id     uuid REFERENCES turns (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX room_events_recent ON room_events (room_id, id DESC);
CREATE INDEX room_events_queued ON room_events (id) WHERE handling = 'queued';

-- Pepper's posts, recorded before they are sent: txn_id (the turn and the post's sequence in it)
-- goes to the homeserver as the transaction id, so a post retried after a crash is the same post.
CREATE TABLE room_posts (
    txn_id      text PRIMARY KEY,
    room_id     uuid NOT NULL REFERENCES rooms (id) ON DELETE CASCADE,
    turn_id     uuid REFERENCES turns (id) ON DELETE SET NULL,
    answers     bigint REFERENCES room_events (id) ON DELETE SET NULL,
    to_account  uuid REFERENCES accounts (id) ON DELETE SET NULL,  -- whom it answered (follow-ups)
    to_agent    boolean NOT NULL DEFAULT false,                     -- it answered a non-member
    body        text NOT NULL,
    event_id    text UNIQUE,                 -- set once the homeserver took it
    failed      text,                        -- the homeserver refused it for good (errcode)
    created_at  timestamptz NOT NULL DEFAULT now(),
    posted_at   timestamptz
);
CREATE INDEX room_posts_unsent ON room_posts (created_at) WHERE event_id IS NULL AND failed IS NULL;
CREATE INDEX room_posts_room ON room_posts (room_id, created_at DESC);

-- The room's shared notes and to-dos (any member's, through Pepper in the room).
CREATE TABLE room_notes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    room_id     uuid NOT NULL REFERENCES rooms (id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind IN ('note', 'todo')),
    body        text NOT NULL CHECK (length(btrim(body)) > 0),
    done        boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX room_notes_room ON room_notes (room_id, id);

-- What each member shares of each of their calendars with a room. No row: nothing.
CREATE TABLE room_calendar_shares (
    room_id      uuid NOT NULL,
    account_id   uuid NOT NULL,
    calendar_id  uuid NOT NULL REFERENCES calendars (id) ON DELETE CASCADE,
    level        text NOT NULL CHECK (level IN ('nothing', 'free_busy', 'titles', 'everything')),
    changed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (room_id, account_id, calendar_id),
    FOREIGN KEY (room_id, account_id) REFERENCES room_members (room_id, account_id) ON DELETE CASCADE
);

-- A member's own skill shared to a room: by reference (the room reads the skill's current text
-- each turn), gone when the member deletes it or leaves the room.
CREATE TABLE room_skills (
    room_id     uuid NOT NULL,
    account_id  uuid NOT NULL,
    name        text NOT NULL,
    shared_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (room_id, name),
    FOREIGN KEY (room_id, account_id) REFERENCES room_members (room_id, account_id) ON DELETE CASCADE,
    FOREIGN KEY (account_id, name) REFERENCES user_skills (account_id, name) ON DELETE CASCADE ON UPDATE CASCADE
);
