-- A line's calls may run on a realtime voice provider from a plugin ('plugin:NAME', voice.engines).
ALTER TABLE phone_lines DROP CONSTRAINT IF EXISTS phone_lines_voice_engine_check;
ALTER TABLE phone_lines ADD CONSTRAINT phone_lines_voice_engine_check
    CHECK (voice_engine IN ('openai-realtime', 'gemini-live', 'cascade') OR voice_engine LIKE 'plugin:_%');
