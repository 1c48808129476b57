-- Calls held by media processes (gateway/media_procs.py, voice/control.py).
--   held_by  the Postgres backend pid of the listening connection of the process holding the call:
--            a status callback received by any process reaches the holder with
--            pg_notify('pepper_calls', call_sid); a call with no summary yet (its end unwritten)
--            whose pid is gone was left by a process that died, and any media process writes its end.
ALTER TABLE calls ADD COLUMN held_by integer;
CREATE INDEX calls_held_unfinished ON calls (held_by) WHERE summary IS NULL;
