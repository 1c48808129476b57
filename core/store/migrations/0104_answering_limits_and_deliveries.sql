-- The answering service's trust-boundary limits, and its deliveries recorded before they are sent.
--
-- Limits (answering_settings): calls answered per line per hour (every caller, anonymous or not),
-- texts to callers per line per hour, and the countries a caller's confirmation text may go to
-- (empty: the country of PEPPER_DEFAULT_REGION).
ALTER TABLE answering_settings
    ADD COLUMN max_line_calls_per_hour integer NOT NULL DEFAULT 30
        CHECK (max_line_calls_per_hour BETWEEN 1 AND 10000),
    ADD COLUMN max_texts_per_hour integer NOT NULL DEFAULT 10 CHECK (max_texts_per_hour BETWEEN 0 AND 10000),
    ADD COLUMN sms_countries text[] NOT NULL DEFAULT '{}';  -- ISO 3166 region codes, e.g. {GB,IE}

-- What a call promised (a caller's confirmation text, the owner's notice), recorded in the same
-- transaction as the booking or message it is about, and sent by the turn workers
-- (gateway/worker.py), never by the call's own tasks, which a hang-up cancels.
CREATE TABLE answering_deliveries (
    id           bigserial PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    call_sid     text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('caller_text', 'owner_notice')),
    to_number    text,            -- caller_text: the caller ID it goes to (E.164)
    from_number  text,            -- caller_text: the line it goes from
    body         text,            -- caller_text: fixed when recorded
    due_at       timestamptz NOT NULL DEFAULT now(),
    status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sending', 'sent', 'failed')),
    attempts     integer NOT NULL DEFAULT 0,
    claimed_at   timestamptz,
    sent_at      timestamptz,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (kind <> 'caller_text' OR (to_number IS NOT NULL AND from_number IS NOT NULL AND body IS NOT NULL))
);
CREATE INDEX answering_deliveries_due ON answering_deliveries (due_at) WHERE status IN ('pending', 'sending');
CREATE INDEX answering_deliveries_line ON answering_deliveries (from_number, created_at) WHERE kind = 'caller_text';
-- One owner notice waiting per call: a later write of the call joins it (the notice reads the
-- call's message and bookings when it is sent).
CREATE UNIQUE INDEX answering_deliveries_one_notice ON answering_deliveries (call_sid)
    WHERE kind = 'owner_notice' AND status = 'pending';

-- A delivery due now wakes a turn worker, as a queued message does.
CREATE FUNCTION answering_delivery_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'pending' AND NEW.due_at <= now() THEN
        PERFORM pg_notify('pepper_turns', 'delivery');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER answering_delivery_due AFTER INSERT OR UPDATE OF due_at ON answering_deliveries
    FOR EACH ROW EXECUTE FUNCTION answering_delivery_due();
