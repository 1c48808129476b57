-- Skills: the owner's own skill files, and the skills part of each turn record.

-- The file as the owner wrote it; parsed again (and checked against the limits) every time it runs.
CREATE TABLE user_skills (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name        text NOT NULL,
    source      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, name)
);

-- Which skills the turn listed and activated, its workers' runs, and the required-step flags.
ALTER TABLE turns ADD COLUMN skills jsonb;
