-- Scheduled tasks: a prompt on a schedule, each occurrence claimed with a lease and left with a
-- receipt; deliveries keyed by (task, occurrence, channel) so a re-run never posts twice.

-- Where the owner is, for schedules that follow sunrise or sunset.
CREATE TABLE account_places (
    account_id  uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    latitude    double precision NOT NULL CHECK (latitude BETWEEN -90 AND 90),
    longitude   double precision NOT NULL CHECK (longitude BETWEEN -180 AND 180),
    label       text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE scheduled_tasks (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id         uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind               text NOT NULL DEFAULT 'task' CHECK (kind IN ('task', 'reminder')),
    title              text NOT NULL CHECK (length(btrim(title)) > 0),
    prompt             text NOT NULL CHECK (length(btrim(prompt)) > 0),
    schedule           jsonb NOT NULL,          -- see text_loop/scheduler/schedule.py
    timezone           text,                    -- NULL: the account's time zone at each run
    deliver_to         text[] NOT NULL DEFAULT '{}',  -- empty: the person's usual channel
    offset_seconds     integer NOT NULL DEFAULT 0 CHECK (offset_seconds >= 0),
    status             text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'done', 'cancelled')),
    next_run_at        timestamptz,             -- the next occurrence, before the offset
    created_turn_id    uuid REFERENCES turns (id) ON DELETE SET NULL,
    cancelled_turn_id  uuid REFERENCES turns (id) ON DELETE SET NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    cancelled_at       timestamptz
);
CREATE INDEX scheduled_tasks_account ON scheduled_tasks (account_id, status);
CREATE INDEX scheduled_tasks_next ON scheduled_tasks (next_run_at) WHERE status = 'active';
CREATE INDEX scheduled_tasks_cancelled_turn ON scheduled_tasks (cancelled_turn_id) WHERE cancelled_turn_id IS NOT NULL;

-- One row per occurrence: its claim while it runs, then its receipt.
CREATE TABLE task_runs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id           bigint NOT NULL REFERENCES scheduled_tasks (id) ON DELETE CASCADE,
    occurrence_at     timestamptz NOT NULL,     -- the nominal time, the occurrence's identity
    due_at            timestamptz NOT NULL,     -- occurrence plus the task's offset (or a retry time)
    ready_at          timestamptz NOT NULL,     -- when it can be claimed: due_at, or its lease's expiry
    status            text NOT NULL DEFAULT 'due'
                      CHECK (status IN ('due', 'running', 'ran', 'silent', 'failed', 'missed')),
    lease_owner       text,
    lease_expires_at  timestamptz,
    heartbeat_at      timestamptz,
    attempts          integer NOT NULL DEFAULT 0,
    turn_id           uuid REFERENCES turns (id) ON DELETE SET NULL,
    evidence          jsonb,
    reason            text,
    started_at        timestamptz,
    finished_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (task_id, occurrence_at)
);
-- Claimed rows move to their lease's expiry, so a claim never scans past runs others hold.
CREATE INDEX task_runs_claimable ON task_runs (ready_at) WHERE status IN ('due', 'running');
CREATE INDEX task_runs_task_recent ON task_runs (task_id, occurrence_at DESC);

-- One row per (task, occurrence, channel): the key that stops a double post.
CREATE TABLE task_deliveries (
    key                  text PRIMARY KEY,
    run_id               bigint NOT NULL REFERENCES task_runs (id) ON DELETE CASCADE,
    channel              text NOT NULL,
    status               text NOT NULL CHECK (status IN ('sending', 'delivered', 'queued', 'failed', 'unavailable')),
    attempt              integer NOT NULL,
    provider_message_id  text,
    detail               text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX task_deliveries_run ON task_deliveries (run_id);
