-- Call minutes count toward the person's usage day (core.usage): once, when a call's end is first
-- recorded, whichever path records it (the status callback, the engine, the orphan sweep).
-- A refused call was never answered and costs nothing.

CREATE FUNCTION calls_add_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_days (account_id, day, call_seconds)
    VALUES (NEW.account_id, (NEW.started_at AT TIME ZONE 'UTC')::date,
            greatest(0, extract(epoch FROM NEW.ended_at - NEW.started_at)))
    ON CONFLICT (account_id, day) DO UPDATE SET call_seconds = usage_days.call_seconds + EXCLUDED.call_seconds;
    RETURN NULL;
END $$;

CREATE TRIGGER calls_usage AFTER UPDATE OF ended_at ON calls
    FOR EACH ROW WHEN (OLD.ended_at IS NULL AND NEW.ended_at IS NOT NULL AND NEW.account_id IS NOT NULL
                       AND NEW.status <> 'refused')
    EXECUTE FUNCTION calls_add_usage();
