-- Where each inbound message stands in being answered, so a crash between the acknowledgement and
-- the reply never leaves a message silently unanswered, and no message is answered twice.
--   queued   recorded, its turn not started yet
--   running  a process claimed it and runs its turn
--   done     answered (or its reply could not be sent: the turn record says why)
--   skipped  needs no turn (a STOP/START/HELP keyword, or the handle has opted out)
--   expired  found queued too long after a crash to answer sensibly
ALTER TABLE messages
    ADD COLUMN handling text CHECK (handling IN ('queued', 'running', 'done', 'skipped', 'expired')),
    -- Channel details a reply needs (the number it was sent to, the sender's address as written).
    ADD COLUMN meta jsonb NOT NULL DEFAULT '{}';
CREATE INDEX messages_unanswered ON messages (created_at) WHERE handling IN ('queued', 'running');
