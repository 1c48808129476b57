-- A line's calls may run on GPT-Live (0130) and on a plugin's voice provider (0138): 0138 was
-- written beside 0130 and left gpt-live out; both together here.
ALTER TABLE phone_lines DROP CONSTRAINT IF EXISTS phone_lines_voice_engine_check;
ALTER TABLE phone_lines ADD CONSTRAINT phone_lines_voice_engine_check
    CHECK (voice_engine IN ('openai-realtime', 'gemini-live', 'gpt-live', 'cascade') OR voice_engine LIKE 'plugin:_%');
