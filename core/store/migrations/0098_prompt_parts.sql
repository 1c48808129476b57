-- The byte-stable parts of a turn's prompt stored once, not in every turn record.
--
-- Every turn record kept its whole prompt, and most of it (the system prefix: persona, rules,
-- skills, the dossier; and the schemas of every tool offered) is the same turn after turn: about
-- 10 kB of write-ahead log per turn that every durable commit behind it (an SMS acknowledgement)
-- had to wait to flush. Each such part is now stored once, named by the SHA-256 of its JSON text,
-- and a turn record names its parts in ``prompt_prefix`` and ``prompt_tools``; its ``prompt``
-- keeps the rest (``system_dynamic``, ``messages``). ``turn_prompt(t)`` puts the whole prompt
-- back together, the same JSON as before. Rows written before this migration have neither column
-- and keep their whole prompt inline, which ``turn_prompt`` returns as it is.
--
-- No foreign key: the check would lock the part's row in every turn's transaction (a multixact
-- once turns overlap), for rows that are never updated or deleted.
CREATE TABLE prompt_parts (
    hash  bytea PRIMARY KEY CHECK (octet_length(hash) = 32),
    body  jsonb NOT NULL
);

ALTER TABLE turns ADD COLUMN prompt_prefix bytea, ADD COLUMN prompt_tools bytea;

-- NULL for a part that is missing (never expected: a part is stored in the same transaction as
-- the first record naming it, and durably); readers say so rather than replay half a prompt.
CREATE FUNCTION turn_prompt(t turns) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN t.prompt IS NULL OR (t.prompt_prefix IS NULL AND t.prompt_tools IS NULL) THEN t.prompt
        ELSE t.prompt || jsonb_build_object(
            'system_stable', (SELECT body FROM prompt_parts WHERE hash = t.prompt_prefix),
            'tools', (SELECT body FROM prompt_parts WHERE hash = t.prompt_tools))
    END
$$;
