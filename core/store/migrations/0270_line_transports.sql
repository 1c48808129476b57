-- How calls reach each line's voice model (docs/voice.md "Transports"): Twilio Media Streams
-- through Pepper, or SIP direct to OpenAI. NULL: the server's PEPPER_VOICE_TRANSPORT.
ALTER TABLE phone_lines ADD COLUMN voice_transport text
    CHECK (voice_transport IN ('media-streams', 'sip'));
