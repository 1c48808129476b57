-- A line's calls may run on GPT-Live (the gpt-live engine) too.
ALTER TABLE phone_lines DROP CONSTRAINT IF EXISTS phone_lines_voice_engine_check;
ALTER TABLE phone_lines
    ADD CONSTRAINT phone_lines_voice_engine_check
    CHECK (voice_engine IN ('openai-realtime', 'gemini-live', 'gpt-live', 'cascade'));
