-- Following (core/following/): web pages, calendar feeds, RSS/Atom feeds (a person, a topic: their items
-- are read by the feeds area), teams and TV shows a person follows,
-- each check of them, and the events they give. Followed events show in the agenda; they are
-- written to a calendar only when the source opts in (write_to_calendar).

CREATE TABLE follows (
    id                 bigserial PRIMARY KEY,
    account_id         uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind               text NOT NULL CHECK (kind IN ('page', 'calendar', 'feed', 'team', 'show')),
    target             text NOT NULL,        -- the URL, or the source's own id (a team's, a show's)
    title              text NOT NULL,
    write_to_calendar  boolean NOT NULL DEFAULT false,
    calendar_id        uuid REFERENCES calendars (id) ON DELETE SET NULL,  -- a calendar feed's row
    feed_id            bigint REFERENCES feeds (id) ON DELETE SET NULL,    -- an RSS/Atom feed's row (the feeds area)
    etag               text,
    modified           text,
    fingerprint        text,                 -- of the page's text at the last extraction
    versions           integer NOT NULL DEFAULT 0,  -- changed versions extracted so far
    next_check_at      timestamptz NOT NULL DEFAULT now(),
    lease_owner        text,
    lease_expires_at   timestamptz,
    last_checked_at    timestamptz,
    last_status        text,
    last_detail        text,
    failures           integer NOT NULL DEFAULT 0,  -- failed checks in a row
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, kind, target)
);
CREATE INDEX follows_due ON follows (next_check_at);

-- Every check, so `pepper follow list` can say what the last one found and no failure is silent.
CREATE TABLE follow_checks (
    id           bigserial PRIMARY KEY,
    follow_id    bigint NOT NULL REFERENCES follows (id) ON DELETE CASCADE,
    checked_at   timestamptz NOT NULL DEFAULT now(),
    status       text NOT NULL CHECK (status IN ('changed', 'unchanged', 'fingerprint-equal', 'failed')),
    events       integer,                   -- events extracted (changed)
    model_calls  integer NOT NULL DEFAULT 0,
    detail       text
);
CREATE INDEX follow_checks_of ON follow_checks (follow_id, id DESC);

-- Events a followed source gives. Never deleted by a check: an event the source leaves out is
-- hidden after two changed versions in a row leave it out, and comes back if it returns.
CREATE TABLE followed_events (
    id           bigserial PRIMARY KEY,
    follow_id    bigint NOT NULL REFERENCES follows (id) ON DELETE CASCADE,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    source_key   text,                      -- a structured source's own id (an event's, an episode's)
    title        text NOT NULL,
    starts_at    timestamptz NOT NULL,
    ends_at      timestamptz NOT NULL,
    all_day      boolean NOT NULL DEFAULT false,
    location     text,
    quote        text,                      -- the page's words that support it (a page)
    status       text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled', 'hidden')),
    missed       integer NOT NULL DEFAULT 0,  -- changed versions in a row that left it out
    calendar_event_id uuid,                 -- its copy in Pepper's calendar, when the source writes there
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (follow_id, source_key)
);
CREATE INDEX followed_events_agenda ON followed_events (account_id, starts_at) WHERE status <> 'hidden';
