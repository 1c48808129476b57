-- The circuit breaker on runaway loops (core.usage.breaker): turns of a conversation or runs of a
-- scheduled task that hit the round cap or fail, in a row within an hour; at the limit it pauses.

CREATE TABLE breakers (
    key         text PRIMARY KEY,   -- conversation:<uuid> or task:<id>
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    strikes     integer NOT NULL DEFAULT 0,
    first_at    timestamptz NOT NULL,
    paused_at   timestamptz,
    reason      text
);
