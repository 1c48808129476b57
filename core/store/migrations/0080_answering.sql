-- The answering service: the owner's rules for callers, what callers left, and what they booked.

-- One row per account. Everything a caller may learn about the owner is written here by the owner.
CREATE TABLE answering_settings (
    account_id          uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    greeting            text NOT NULL DEFAULT 'Hello, you have reached an assistant who takes messages for this number.',
    caller_info         text NOT NULL DEFAULT '',      -- what callers may be told (hours, address...)
    booking_enabled     boolean NOT NULL DEFAULT false,
    appointment_types   jsonb NOT NULL DEFAULT '[{"name": "meeting", "minutes": 30}]',
    working_hours       jsonb NOT NULL DEFAULT
        '{"mon": [["09:00", "17:00"]], "tue": [["09:00", "17:00"]], "wed": [["09:00", "17:00"]],
          "thu": [["09:00", "17:00"]], "fri": [["09:00", "17:00"]]}',
    buffer_minutes      integer NOT NULL DEFAULT 10 CHECK (buffer_minutes BETWEEN 0 AND 240),
    min_notice_minutes  integer NOT NULL DEFAULT 120 CHECK (min_notice_minutes BETWEEN 0 AND 43200),
    horizon_days        integer NOT NULL DEFAULT 30 CHECK (horizon_days BETWEEN 1 AND 365),
    vip_numbers         text[] NOT NULL DEFAULT '{}',  -- E.164
    blocked_numbers     text[] NOT NULL DEFAULT '{}',  -- E.164
    notify_channel      text NOT NULL DEFAULT 'sms' CHECK (notify_channel IN ('sms', 'email', 'web')),
    send_invitations    boolean NOT NULL DEFAULT false,
    max_calls_per_hour  integer NOT NULL DEFAULT 5 CHECK (max_calls_per_hour BETWEEN 1 AND 1000),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- One row per answered call: the caller's number and the transcript, kept apart from the owner's
-- conversation (a caller's words never become the owner's memory).
CREATE TABLE answering_calls (
    call_sid        text PRIMARY KEY,
    account_id      uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    caller          text,                 -- E.164 caller ID as Twilio gave it (may be spoofed)
    forwarded_from  text,
    vip             boolean NOT NULL DEFAULT false,
    transcript      jsonb NOT NULL DEFAULT '[]',
    summary         text,
    end_reason      text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);
CREATE INDEX answering_calls_caller ON answering_calls (account_id, caller, started_at);

-- A message taken for the owner (one per take_message call; repeats of the same call update it).
CREATE TABLE answering_messages (
    id               bigserial PRIMARY KEY,
    call_sid         text NOT NULL REFERENCES answering_calls (call_sid) ON DELETE CASCADE,
    account_id       uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    caller_name      text NOT NULL,
    callback_number  text NOT NULL,
    reason           text NOT NULL,
    urgency          text NOT NULL CHECK (urgency IN ('normal', 'urgent')),
    vip              boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    notified_at      timestamptz,
    notify_channel   text,
    notify_error     text
);
CREATE UNIQUE INDEX answering_messages_one_per_call ON answering_messages (call_sid);

-- A slot held while the caller hears it confirmed; the booking commits on the confirmation's mark.
CREATE TABLE answering_holds (
    booking_key  text PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    call_sid     text NOT NULL,
    starts_at    timestamptz NOT NULL,
    ends_at      timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX answering_holds_account ON answering_holds (account_id, starts_at);

-- A booking a caller made; the event itself is in calendar_events.
CREATE TABLE answering_bookings (
    id                    bigserial PRIMARY KEY,
    account_id            uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    call_sid              text NOT NULL,
    booking_key           text NOT NULL UNIQUE,
    event_id              uuid REFERENCES calendar_events (id) ON DELETE SET NULL,
    line_number           text,
    caller_number         text NOT NULL,
    caller_name           text NOT NULL,
    appointment_type      text NOT NULL,
    starts_at             timestamptz NOT NULL,
    ends_at               timestamptz NOT NULL,
    status                text NOT NULL DEFAULT 'booked' CHECK (status IN ('booked', 'cancelled', 'moved')),
    offered               jsonb,          -- times offered by SMS for a move, awaiting the caller's pick
    confirmation_sent_at  timestamptz,
    owner_notified_at     timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX answering_bookings_caller ON answering_bookings (caller_number, status, starts_at);
