-- Who said an inbound message when it is not the conversation's person. A caller on the owner's
-- line is recorded in the owner's conversation from the first word, but until they prove who they
-- are (the PIN, a one-time code) their words are an unverified caller's, not the person's: the
-- memory block, the summaries' records and search show them as such (core.conversation).
-- NULL: the person (inbound) or Pepper (outbound), as before.

ALTER TABLE messages ADD COLUMN author text CHECK (author IN ('unverified_caller'));

-- A summary written from records that hold callers' words (an answering-service call, a caller
-- who never proved who they are): shown with a label saying so wherever a model reads it (the
-- memory block, the dossier rewrite).
ALTER TABLE memory_summaries ADD COLUMN callers boolean NOT NULL DEFAULT false;
