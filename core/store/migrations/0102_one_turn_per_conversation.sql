-- One person's messages are answered one turn at a time, and texts that arrived while Pepper was
-- busy with that person are answered together, by one turn (core/conversation.py claim_turn).
-- Two turns of one conversation at once could each miss what the other is doing, stage writes that
-- contradict each other, and send their replies in either order; and a person who sends three
-- texts in a row expects one answer, not three.

CREATE INDEX messages_running ON messages (conversation_id) WHERE handling = 'running';

-- Claim the oldest queued inbound message of a conversation no turn is answering, with the texts
-- of the same burst (same channel, sender and Pepper number, queued after it; at most p_burst in
-- all, SMS and WhatsApp only: an email or a web post is answered on its own). A message whose
-- turn was cut short (turn_id set) is claimed with the others of that turn only.
CREATE FUNCTION pepper_claim_turn(p_worker integer, p_burst integer) RETURNS SETOF messages
LANGUAGE plpgsql AS $$
DECLARE
    first messages;
BEGIN
    LOOP
        -- The conversation's row is the claim's lock: a second worker skips a conversation being
        -- claimed at this moment, instead of claiming another of its messages.
        SELECT m.* INTO first
        FROM messages m JOIN conversations c ON c.id = m.conversation_id
        WHERE m.handling = 'queued' AND m.direction = 'inbound'
          AND NOT EXISTS (SELECT 1 FROM messages r
                          WHERE r.conversation_id = m.conversation_id AND r.handling = 'running')
        ORDER BY m.id LIMIT 1
        FOR UPDATE OF m, c SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        -- A statement of its own, so a fresh snapshot: it sees a claim of this conversation that
        -- another worker committed after the search above began. Then the search runs again and
        -- leaves this conversation out.
        EXIT WHEN NOT EXISTS (SELECT 1 FROM messages
                              WHERE conversation_id = first.conversation_id AND handling = 'running');
    END LOOP;
    RETURN QUERY
    UPDATE messages m SET handling = 'running', claimed_by = p_worker
    WHERE m.id = first.id OR m.id IN (
        SELECT b.id FROM messages b
        WHERE b.conversation_id = first.conversation_id AND b.id > first.id
          AND b.handling = 'queued' AND b.direction = 'inbound'
          AND CASE WHEN first.turn_id IS NOT NULL THEN b.turn_id = first.turn_id
                   ELSE first.channel IN ('sms', 'whatsapp') AND b.turn_id IS NULL
                        AND b.channel = first.channel AND b.handle_id = first.handle_id
                        AND b.meta ->> 'to' IS NOT DISTINCT FROM first.meta ->> 'to' END
        ORDER BY b.id LIMIT greatest(p_burst - 1, 0)
        FOR UPDATE SKIP LOCKED)
    RETURNING m.*;
END $$;
