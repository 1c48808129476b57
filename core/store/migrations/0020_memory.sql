-- Memory: rolling summaries, the dossier's model half and its revisions, the search index,
-- and the bookkeeping of the memory jobs.

-- A summary of one local day, week (Monday to Sunday) or month of a person's conversation, in
-- the person's time zone. Written once, in one transaction, from the records of what it covers.
CREATE TABLE memory_summaries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id     uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    period         text NOT NULL CHECK (period IN ('day', 'week', 'month')),
    starts_on      date NOT NULL,            -- first local day covered
    ends_on        date NOT NULL,            -- last local day covered (inclusive)
    covers_from    timestamptz NOT NULL,     -- the same span as instants: [from, until)
    covers_until   timestamptz NOT NULL,
    body           text NOT NULL CHECK (length(btrim(body)) > 0),
    messages       integer NOT NULL,         -- how many messages it was built from
    turns          integer NOT NULL,         -- how many turn records it was built from
    model          text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, period, starts_on),
    CHECK (covers_until > covers_from)
);
CREATE INDEX memory_summaries_account ON memory_summaries (account_id, period, covers_from);

-- The model's half of the dossier: the text of its last accepted rewrite; the notes added after
-- it (dossier_notes.id > model_notes_through) are shown below it until the next rewrite.
ALTER TABLE dossiers
    ADD COLUMN model_text           text NOT NULL DEFAULT '',
    ADD COLUMN model_notes_through  bigint NOT NULL DEFAULT 0,
    ADD COLUMN model_updated_at     timestamptz;

-- Every change to either half (notes are rows of dossier_notes and are never deleted), and every
-- rejected rewrite with its reason. The state of the model's half at any time is the last
-- accepted model revision plus the notes after its notes_through.
CREATE TABLE dossier_revisions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id     uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    half           text NOT NULL CHECK (half IN ('owner', 'model')),
    body           text NOT NULL,
    source         text NOT NULL,            -- cli, web, rewrite
    accepted       boolean NOT NULL DEFAULT true,
    reason         text,                     -- why a rewrite was rejected
    notes_through  bigint,
    model          text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dossier_revisions_account ON dossier_revisions (account_id, id);

-- Documents Pepper makes (briefs, drafts, reports): searchable beside the messages.
CREATE TABLE memory_documents (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind        text NOT NULL,
    title       text NOT NULL,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX memory_documents_account ON memory_documents (account_id, id);

-- The meaning-search index: one row per chunk of a message or document per embedding model.
-- The vector column has no fixed size so two models can live side by side during a re-index;
-- each model gets a partial HNSW index on a sized cast (created by core.memory.index).
CREATE TABLE memory_index (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    model_id     text NOT NULL,
    message_id   bigint REFERENCES messages (id) ON DELETE CASCADE,
    document_id  bigint REFERENCES memory_documents (id) ON DELETE CASCADE,
    chunk        integer NOT NULL DEFAULT 0,
    chunk_start  integer NOT NULL DEFAULT 0,
    chunk_end    integer NOT NULL,
    created_at   timestamptz NOT NULL,       -- when the source was written
    embedding    vector NOT NULL,
    CHECK ((message_id IS NULL) <> (document_id IS NULL))
);
CREATE UNIQUE INDEX memory_index_message ON memory_index (model_id, message_id, chunk) WHERE message_id IS NOT NULL;
CREATE UNIQUE INDEX memory_index_document ON memory_index (model_id, document_id, chunk)
    WHERE document_id IS NOT NULL;
CREATE INDEX memory_index_account ON memory_index (account_id, model_id);

-- Which embedding model the index answers with, and the one it is being built for.
CREATE TABLE memory_index_state (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    active_model    text,
    target_model    text,
    target_dimensions  integer,
    message_cursor     bigint NOT NULL DEFAULT 0,   -- indexing for the target has passed these ids
    document_cursor    bigint NOT NULL DEFAULT 0,
    reindex_started_at timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO memory_index_state DEFAULT VALUES;

-- The jobs look for activity in a window of time across everyone.
CREATE INDEX messages_created ON messages (created_at);
CREATE INDEX turns_started ON turns (started_at);

-- Keyword (quoted phrase) search over messages.
CREATE INDEX messages_body_words ON messages USING gin (to_tsvector('simple', body));

-- The memory jobs: one row per person, kind and period. Claimed with a lease so several
-- processes never run the same job; a failure is retried later with a growing delay.
CREATE TABLE memory_jobs (
    account_id       uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind             text NOT NULL CHECK (kind IN ('day', 'week', 'month', 'dossier')),
    period_start     date NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'done', 'failed', 'abandoned')),
    attempts         integer NOT NULL DEFAULT 0,
    due_at           timestamptz NOT NULL,
    leased_until     timestamptz,
    last_error       text,
    outcome          text,
    finished_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, kind, period_start)
);
CREATE INDEX memory_jobs_due ON memory_jobs (due_at) WHERE status IN ('pending', 'failed', 'running');
