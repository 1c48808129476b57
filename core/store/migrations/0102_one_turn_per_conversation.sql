-- One person's messages are answered one turn at a time, and texts that arrived while Pepper was
-- busy with that person are answered together, by one turn (core/conversation.py claim_turn).
-- Two turns of one conversation at once could each miss what the other is doing, stage writes that
-- contradict each other, and send their replies in either order; and a person who sends three
-- texts in a row expects one answer, not three.

CREATE INDEX messages_running ON messages (conversation_id) WHERE handling = 'running';
-- The queue by conversation: a claim visits each waiting conversation once, however many
-- messages wait in it (a busy person's backlog is not scanned on every claim).
CREATE INDEX messages_queued ON messages (conversation_id, id) WHERE handling = 'queued' AND direction = 'inbound';

-- Claim the oldest queued inbound message of a conversation no turn is answering, with the texts
-- of the same burst (same channel, sender and Pepper number, queued after it; at most p_burst in
-- all, SMS and WhatsApp only: an email or a web post is answered on its own). A message whose
-- turn was cut short (turn_id set) is claimed with the others of that turn only.
CREATE FUNCTION pepper_claim_turn(p_worker integer, p_burst integer) RETURNS SETOF messages
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
            SELECT 1 FROM messages WHERE conversation_id = chosen AND handling = 'running');
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
