-- Which realtime engine a line's calls run on; NULL follows the voice_engine setting.
ALTER TABLE phone_lines
    ADD COLUMN voice_engine text CHECK (voice_engine IN ('openai-realtime', 'gemini-live', 'cascade'));
