-- A scheduled turn (a briefing, a reminder's follow-up) answers in the person's one conversation
-- too, so it takes its turn like a message turn (0102): while it runs, the person's messages wait
-- for it, and it waits for a message turn under way. Otherwise the two could each miss what the
-- other is doing and stage writes that contradict each other. The hold is a lease, renewed by the
-- scheduler's heartbeat: a process that dies mid-turn leaves it to expire.

ALTER TABLE conversations ADD COLUMN held_until timestamptz;

-- Hold the conversation for a scheduled turn: false while a message turn or another hold is
-- under way. The row lock waits for a claim of this conversation in progress; the checks after it
-- are statements of their own, so they see what that claim committed.
CREATE FUNCTION pepper_hold_conversation(p_conversation uuid, p_lease interval) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM conversations WHERE id = p_conversation FOR NO KEY UPDATE;
    IF EXISTS (SELECT 1 FROM messages WHERE conversation_id = p_conversation AND handling = 'running')
       OR EXISTS (SELECT 1 FROM conversations WHERE id = p_conversation AND held_until > now()) THEN
        RETURN false;
    END IF;
    UPDATE conversations SET held_until = now() + p_lease WHERE id = p_conversation;
    RETURN true;
END $$;

-- The claim of 0102, now also passing over a held conversation.
CREATE OR REPLACE FUNCTION pepper_claim_turn(p_worker integer, p_burst integer) RETURNS SETOF messages
LANGUAGE plpgsql AS $$
DECLARE
    chosen uuid;
    first messages;
BEGIN
    LOOP
        -- The conversation's row is the claim's lock: a second worker skips a conversation being
        -- claimed at this moment, instead of claiming another of its messages. NO KEY UPDATE, so
        -- that recording a new message (its foreign key takes KEY SHARE) never waits for a claim.
        WITH RECURSIVE waiting(id) AS (  -- each conversation with queued messages, once
            (SELECT conversation_id FROM messages
             WHERE handling = 'queued' AND direction = 'inbound' ORDER BY conversation_id LIMIT 1)
            UNION ALL
            SELECT (SELECT m.conversation_id FROM messages m
                    WHERE m.handling = 'queued' AND m.direction = 'inbound' AND m.conversation_id > w.id
                    ORDER BY m.conversation_id LIMIT 1)
            FROM waiting w WHERE w.id IS NOT NULL
        ), free AS (
            SELECT w.id, (SELECT min(m.id) FROM messages m
                          WHERE m.conversation_id = w.id AND m.handling = 'queued' AND m.direction = 'inbound') AS oldest
            FROM waiting w
            WHERE w.id IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM messages r WHERE r.conversation_id = w.id AND r.handling = 'running')
        )
        SELECT c.id INTO chosen
        FROM free JOIN conversations c ON c.id = free.id
        WHERE c.held_until IS NULL OR c.held_until <= now()
        ORDER BY free.oldest LIMIT 1
        FOR NO KEY UPDATE OF c SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        -- Statements of their own, so fresh snapshots: they see a claim of this conversation that
        -- another worker committed after the search above began. Then the search runs again and
        -- leaves this conversation out.
        SELECT * INTO first FROM messages
        WHERE conversation_id = chosen AND handling = 'queued' AND direction = 'inbound'
        ORDER BY id LIMIT 1;
        EXIT WHEN FOUND AND NOT EXISTS (
            SELECT 1 FROM messages WHERE conversation_id = chosen AND handling = 'running')
          AND NOT EXISTS (SELECT 1 FROM conversations WHERE id = chosen AND held_until > now());
    END LOOP;
    RETURN QUERY
    UPDATE messages m SET handling = 'running', claimed_by = p_worker
    WHERE m.handling = 'queued' AND (m.id = first.id OR m.id IN (
        SELECT b.id FROM messages b
        WHERE b.conversation_id = first.conversation_id AND b.id > first.id
          AND b.handling = 'queued' AND b.direction = 'inbound'
          AND CASE WHEN first.turn_id IS NOT NULL THEN b.turn_id = first.turn_id
                   ELSE first.channel IN ('sms', 'whatsapp') AND b.turn_id IS NULL
                        AND b.channel = first.channel AND b.handle_id = first.handle_id
                        AND b.meta ->> 'to' IS NOT DISTINCT FROM first.meta ->> 'to' END
        ORDER BY b.id LIMIT greatest(p_burst - 1, 0)))
    RETURNING m.*;
END $$;
