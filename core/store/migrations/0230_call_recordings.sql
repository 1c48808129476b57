-- Each call's recording for deterministic replay (voice.call_tape, `pepper replay-call`): chunks of
-- compressed entries written while the call runs. A call whose process died mid-call has chunks and
-- no final one: its recording is incomplete, and readable up to the last chunk written.
CREATE TABLE call_recordings (
    call_sid    text NOT NULL,
    seq         integer NOT NULL,
    account_id  uuid REFERENCES accounts (id) ON DELETE CASCADE,
    entries     bytea NOT NULL,          -- zlib-compressed JSON list of entries
    final       boolean NOT NULL DEFAULT false,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (call_sid, seq)
);
