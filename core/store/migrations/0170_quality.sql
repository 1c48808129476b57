-- The quality loop: the nightly judge's jobs and grades, the quality issues it opens, and the
-- shadow detectors' states and firings (core/quality/).

-- One judge job per person and local day, leased like the memory jobs so two processes never
-- grade the same night twice.
CREATE TABLE quality_jobs (
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    day           date NOT NULL,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed', 'abandoned')),
    attempts      integer NOT NULL DEFAULT 0,
    due_at        timestamptz NOT NULL,
    leased_until  timestamptz,
    last_error    text,
    outcome       jsonb,
    finished_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, day)
);
CREATE INDEX quality_jobs_due ON quality_jobs (due_at) WHERE status IN ('pending', 'failed', 'running');

-- One grade per judged turn and point: the primary key is what stops a re-run double-grading.
CREATE TABLE quality_grades (
    turn_id      uuid NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    point        text NOT NULL,
    grade        text NOT NULL CHECK (grade IN ('pass', 'fail', 'n/a')),
    reason       text NOT NULL,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    model        text,              -- the judged turn's model and tier
    tier         text,
    judge_model  text,
    graded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (turn_id, point)
);
CREATE INDEX quality_grades_graded ON quality_grades (graded_at);

-- Quality issues in Pepper's own store: a failing point of one turn, the proposed fix and the
-- replay case (``pepper replay --case``) that should fail until the fix lands.
CREATE TABLE quality_issues (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id     uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    turn_id        uuid REFERENCES turns (id) ON DELETE SET NULL,
    point          text NOT NULL,
    reason         text NOT NULL,
    proposed_fix   text NOT NULL,
    replay_case    jsonb NOT NULL,
    status         text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    seen           integer NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (turn_id, point)
);
CREATE INDEX quality_issues_open ON quality_issues (account_id, point) WHERE status = 'open';

-- Each detector's lifecycle: shadow (records only), promotable, promoted (applies its fix),
-- deleted (precision below 40 %) or ended (the four-week trial ran out undecided).
CREATE TABLE quality_detectors (
    name              text PRIMARY KEY,
    state             text NOT NULL DEFAULT 'shadow'
                      CHECK (state IN ('shadow', 'promotable', 'promoted', 'deleted', 'ended')),
    trial_started_at  timestamptz NOT NULL DEFAULT now(),
    decided_at        timestamptz,
    precision         double precision,
    judged            integer NOT NULL DEFAULT 0
);

-- What a detector would have done (shadow) or did (promoted) on one turn; once per turn.
CREATE TABLE detector_firings (
    detector    text NOT NULL,
    turn_id     uuid NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    fired_at    timestamptz NOT NULL DEFAULT now(),
    detail      jsonb NOT NULL DEFAULT '{}',
    applied     boolean NOT NULL DEFAULT false,
    error       text,
    PRIMARY KEY (detector, turn_id)
);
CREATE INDEX detector_firings_turn ON detector_firings (turn_id);
