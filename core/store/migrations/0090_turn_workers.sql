-- Turns run in turn-worker processes, not in the web server (see gateway/worker.py).
--   claimed_by  the Postgres backend pid of the claiming worker's listening connection: while that
--               session lives the worker lives; a 'running' message whose pid is gone was left by a
--               worker that died, and is handed out again.
ALTER TABLE messages ADD COLUMN claimed_by integer;

-- A message waiting for its turn wakes the workers (the webhook only records it).
CREATE FUNCTION pepper_notify_turn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pepper_turns', NEW.id::text);
    RETURN NEW;
END $$;
CREATE TRIGGER messages_turn_queued AFTER INSERT OR UPDATE OF handling ON messages
    FOR EACH ROW WHEN (NEW.handling = 'queued' AND NEW.direction = 'inbound')
    EXECUTE FUNCTION pepper_notify_turn();

-- The web server records a webhook's message in a session with pepper.announce = 'later' and
-- announces it right after the commit (core/conversation.py announce_inbound): NOTIFY holds a
-- global lock through the commit's flush to disk, which would make every acknowledgement wait for
-- the flushes of all the others, one at a time.
CREATE OR REPLACE FUNCTION pepper_notify_message() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('pepper.announce', true) IS DISTINCT FROM 'later' THEN
        PERFORM pg_notify('pepper_messages',
                          json_build_object('conversation_id', NEW.conversation_id, 'id', NEW.id)::text);
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION pepper_notify_turn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('pepper.announce', true) IS DISTINCT FROM 'later' THEN
        PERFORM pg_notify('pepper_turns', NEW.id::text);
    END IF;
    RETURN NEW;
END $$;
