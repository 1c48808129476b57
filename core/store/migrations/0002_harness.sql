-- The text harness: the rest of the turn record, staged writes, and the starter feature areas.

ALTER TABLE turns
    ADD COLUMN trust    text,
    ADD COLUMN session  jsonb,
    ADD COLUMN reply    text,
    ADD COLUMN replay_of uuid REFERENCES turns (id) ON DELETE SET NULL;

-- A write that waits for the reply to be delivered. Resolved once: committed, dropped, or failed
-- (its apply step raised). See core/tools/staging.py for the crash rule.
CREATE TABLE staged_writes (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    turn_id      uuid NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    tool         text NOT NULL,
    area         text NOT NULL,
    payload      jsonb NOT NULL,
    summary      text NOT NULL,
    status       text NOT NULL DEFAULT 'staged' CHECK (status IN ('staged', 'committed', 'dropped', 'failed')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    resolved_at  timestamptz
);
CREATE INDEX staged_writes_turn ON staged_writes (turn_id);
CREATE INDEX staged_writes_pending ON staged_writes (created_at) WHERE status = 'staged';

-- Feature area: notes.
CREATE TABLE notes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notes_account ON notes (account_id, created_at);

-- Feature area: todos.
CREATE TABLE todos (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    title       text NOT NULL,
    done_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX todos_account ON todos (account_id, created_at);

-- Feature area: the dossier. The owner's half is one text; the model's half accumulates notes.
CREATE TABLE dossiers (
    account_id  uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    owner_text  text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE dossier_notes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dossier_notes_account ON dossier_notes (account_id, id);
