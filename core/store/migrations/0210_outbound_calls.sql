-- Calls Pepper places (voice.outbound): one row per attempt, its receipt kept on the row.
-- A scheduled run that delivers by phone makes attempt 1; no answer makes attempt 2, due later.

ALTER TABLE calls DROP CONSTRAINT IF EXISTS calls_route_check;
ALTER TABLE calls ADD CONSTRAINT calls_route_check
    CHECK (route IN ('owner', 'answering', 'refused', 'blocked', 'outbound'));

-- The number one task's calls go to, approved by the owner (the CLI, or a live owner turn) or not
-- (set by a scheduled run: never dialled); a task may always call the owner's own verified numbers.
ALTER TABLE scheduled_tasks ADD COLUMN call_number text;
ALTER TABLE scheduled_tasks ADD COLUMN call_approved boolean NOT NULL DEFAULT false;
-- Keys Twilio presses once the call connects (SendDigits: 0-9, *, #, w for a half-second wait).
ALTER TABLE scheduled_tasks ADD COLUMN call_digits text;

CREATE TABLE outbound_calls (
    id              bigserial PRIMARY KEY,
    account_id      uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    task_id         bigint REFERENCES scheduled_tasks (id) ON DELETE SET NULL,
    run_id          bigint REFERENCES task_runs (id) ON DELETE SET NULL,
    delivery_key    text,                         -- the scheduled delivery it carries
    purpose         text NOT NULL CHECK (purpose IN ('brief', 'callback')),
    attempt         int NOT NULL DEFAULT 1,
    to_number       text NOT NULL,
    from_number     text NOT NULL,
    owner_number    boolean NOT NULL,            -- the callee is one of the owner's verified numbers
    brief           text NOT NULL,               -- what a human hears once they proved who they are
    status          text NOT NULL DEFAULT 'due'
                    CHECK (status IN ('due', 'dialing', 'placed', 'answered', 'done', 'failed', 'refused')),
    dial_at         timestamptz NOT NULL DEFAULT now(),
    call_sid        text UNIQUE,
    answered_by     text,                        -- Twilio's AnsweredBy
    outcome         text,                        -- human, machine, no-answer, busy, failed, refused
    receipt         text,                        -- what happened, in words, for the CLI and the run
    requested_at    timestamptz,                 -- the Calls request left Pepper
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (delivery_key, attempt)
);
CREATE INDEX outbound_calls_due ON outbound_calls (dial_at) WHERE status = 'due';
CREATE INDEX outbound_calls_task ON outbound_calls (task_id, created_at);

-- Twilio status callbacks already acted on: a retried callback does nothing twice.
CREATE TABLE outbound_call_events (
    call_sid        text NOT NULL,
    event           text NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (call_sid, event)
);

-- Strangers (no verified handle) who texted STOP to a line: their calls to it are refused too.
CREATE TABLE line_opt_outs (
    line_number     text NOT NULL,
    number          text NOT NULL,
    opted_out_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (line_number, number)
);

-- Screening signals of answering calls: Twilio Lookup (when configured) and robocall verdicts.
ALTER TABLE answering_calls ADD COLUMN line_type text;
ALTER TABLE answering_calls ADD COLUMN caller_name_lookup text;
ALTER TABLE answering_calls ADD COLUMN screened text;   -- robocall pattern that ended the call, if any

-- A caller handed to the owner (voice.transfer): the <Dial> waits on the call's stream ending; if the
-- owner does not pick up, the caller comes back to Pepper on the same call.
CREATE TABLE call_transfers (
    call_sid        text PRIMARY KEY,
    account_id      uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    to_number       text NOT NULL,
    caller_id       text NOT NULL,               -- the line the owner sees the call come from
    caller_name     text NOT NULL,
    reason          text NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'dialing', 'connected', 'returned')),
    dial_status     text,                        -- Twilio's DialCallStatus
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Whether the answering service may put a caller through to the owner (off unless the owner says so).
ALTER TABLE answering_settings ADD COLUMN transfer_enabled boolean NOT NULL DEFAULT false;

-- Twilio's StirVerstat of an inbound call as it came (TN-Validation-Passed-A/B/C, ...-Failed-..., NULL:
-- none): a call claiming the owner's number without attestation A is told it stays restricted.
ALTER TABLE calls ADD COLUMN stir_verstat text;

-- The answering service told the caller "I'll have them call you back": a todo for the owner.
ALTER TABLE answering_messages ADD COLUMN callback_promised boolean NOT NULL DEFAULT false;
