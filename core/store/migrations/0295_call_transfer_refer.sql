-- A SIP direct call handed to the owner with a REFER (voice.transfer, voice.sip): the call leaves
-- OpenAI and Pepper for the owner's number; nothing comes back.
ALTER TABLE call_transfers DROP CONSTRAINT call_transfers_status_check;
ALTER TABLE call_transfers ADD CONSTRAINT call_transfers_status_check
    CHECK (status IN ('pending', 'dialing', 'connected', 'returned', 'referred'));
