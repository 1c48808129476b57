-- A reply's record is a durable commit, and NOTIFY holds a global lock through the flush of the
-- commit it rides in. With the trigger announcing replies in their own transactions, every
-- acknowledgement's announcement (core/conversation.py announce_message) queued behind the turn
-- workers' reply records, each waiting for the disk, and behind a turn worker's Postgres backend,
-- which runs at the lowest CPU priority. Replies are recorded through this function instead: its
-- insert skips the trigger's announcement (the SET clause holds for the call only) and the caller
-- announces the row right after, in a statement that writes nothing to flush.
CREATE FUNCTION pepper_record_outbound(
    p_conversation uuid, p_channel text, p_provider_message_id text, p_body text, p_turn uuid, p_status text
) RETURNS messages LANGUAGE plpgsql SET pepper.announce = 'later' AS $$
DECLARE
    recorded messages;
BEGIN
    INSERT INTO messages (conversation_id, channel, direction, provider_message_id, body, turn_id, delivery_status)
    VALUES (p_conversation, p_channel, 'outbound', p_provider_message_id, p_body, p_turn, p_status)
    RETURNING * INTO recorded;
    RETURN recorded;
END $$;
