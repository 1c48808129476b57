-- A folder the person lends for one `pepper chat --folder` session: the read-only tools the CLI
-- declared, and each call to them, which the CLI answers from the person's machine. A lending
-- lapses when the CLI stops asking for calls (seen_at) or ends it.
CREATE TABLE lent_folders (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    tools       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz
);
CREATE INDEX lent_folders_account ON lent_folders (account_id) WHERE ended_at IS NULL;

CREATE TABLE lent_folder_calls (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    folder_id    uuid NOT NULL REFERENCES lent_folders (id) ON DELETE CASCADE,
    name         text NOT NULL,
    arguments    jsonb NOT NULL,
    result       text,
    is_error     boolean,
    created_at   timestamptz NOT NULL DEFAULT now(),
    answered_at  timestamptz
);
CREATE INDEX lent_folder_calls_waiting ON lent_folder_calls (folder_id) WHERE answered_at IS NULL;
