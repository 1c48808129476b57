-- A call can run on more than one media stream (after a failed transfer the caller comes back on a
-- new one; after send_digits Pepper does): each stream's engine writes its own recording, so the
-- chunks are keyed by stream too (before, a second stream's chunks collided with the first's
-- sequence numbers and were dropped). Recordings written before this have stream_sid ''.
ALTER TABLE call_recordings ADD COLUMN stream_sid text NOT NULL DEFAULT '';
ALTER TABLE call_recordings DROP CONSTRAINT call_recordings_pkey;
ALTER TABLE call_recordings ADD PRIMARY KEY (call_sid, stream_sid, seq);
