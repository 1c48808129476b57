-- The search index, one partition per person. Every search is scoped to one person; on one shared
-- HNSW graph that filter makes the scan step over everyone else's rows (slower, the more people
-- share the server). Partitioned by account, each model's HNSW index is a partitioned index:
-- every person's partition has a graph of its own, and a search walks only theirs.
-- A person's partition is made when the account is made (a trigger), so new accounts need nothing.

ALTER TABLE memory_index RENAME TO memory_index_unpartitioned;
ALTER TABLE memory_index_unpartitioned RENAME CONSTRAINT memory_index_pkey TO memory_index_unpartitioned_pkey;
ALTER INDEX memory_index_message RENAME TO memory_index_unpartitioned_message;
ALTER INDEX memory_index_document RENAME TO memory_index_unpartitioned_document;
ALTER INDEX memory_index_account RENAME TO memory_index_unpartitioned_account;
-- The old graphs (the shared one per model, any a person had of their own) are not needed for
-- the copy, and their names are free again for the new ones.
DO $$
DECLARE
    old record;
BEGIN
    FOR old IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_am a ON a.oid = c.relam
               WHERE i.indrelid = 'memory_index_unpartitioned'::regclass AND a.amname = 'hnsw' LOOP
        EXECUTE format('DROP INDEX %I', old.relname);
    END LOOP;
END $$;

-- Ids keep counting from where the old table stopped.
CREATE SEQUENCE memory_index_id AS bigint;
SELECT setval('memory_index_id', coalesce((SELECT max(id) FROM memory_index_unpartitioned), 0) + 1, false);

-- The same columns and checks (the column of the ids is now plain, counting on the sequence).
CREATE TABLE memory_index (
    LIKE memory_index_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (account_id, id)
) PARTITION BY LIST (account_id);
ALTER TABLE memory_index
    ALTER COLUMN id SET DEFAULT nextval('memory_index_id'),
    ADD FOREIGN KEY (account_id) REFERENCES accounts (id) ON DELETE CASCADE,
    ADD FOREIGN KEY (message_id) REFERENCES messages (id) ON DELETE CASCADE,
    ADD FOREIGN KEY (document_id) REFERENCES memory_documents (id) ON DELETE CASCADE;
ALTER SEQUENCE memory_index_id OWNED BY memory_index.id;

-- A unique index on a partitioned table must hold the partition key; a source belongs to one
-- person, so adding account_id changes nothing. The source id leads, for the cascades on delete.
CREATE UNIQUE INDEX memory_index_message ON memory_index (message_id, model_id, chunk, account_id)
    WHERE message_id IS NOT NULL;
CREATE UNIQUE INDEX memory_index_document ON memory_index (document_id, model_id, chunk, account_id)
    WHERE document_id IS NOT NULL;
CREATE INDEX memory_index_model ON memory_index (model_id, chunk);

-- The person's partition, made if missing. Named after the account so it is easy to find.
CREATE FUNCTION memory_index_partition(person uuid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    part text := 'memory_index_' || replace(person::text, '-', '');
BEGIN
    IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF memory_index FOR VALUES IN (%L)', part, person);
    END IF;
END $$;

CREATE FUNCTION memory_index_new_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM memory_index_partition(NEW.id);
    RETURN NULL;
END $$;

CREATE TRIGGER accounts_memory_index_partition AFTER INSERT ON accounts
    FOR EACH ROW EXECUTE FUNCTION memory_index_new_account();

-- A deleted account's partition goes too (its rows went first, by the cascade: the cascade's
-- trigger sorts before this one).
CREATE FUNCTION memory_index_gone_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TABLE IF EXISTS %I', 'memory_index_' || replace(OLD.id::text, '-', ''));
    RETURN NULL;
END $$;

CREATE TRIGGER accounts_memory_index_drop_partition AFTER DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION memory_index_gone_account();

SELECT memory_index_partition(id) FROM accounts;

INSERT INTO memory_index (id, account_id, model_id, message_id, document_id, chunk, chunk_start, chunk_end,
                          created_at, embedding)
SELECT id, account_id, model_id, message_id, document_id, chunk, chunk_start, chunk_end, created_at, embedding
FROM memory_index_unpartitioned;

-- Each model's HNSW index (cosine, on the sized cast), now one graph per person. The name must
-- match core.memory.index.hnsw_index_name. Built after the copy: faster than row by row.
DO $$
DECLARE
    m record;
BEGIN
    -- Read from the old table: a query open on the new one would forbid indexing it.
    FOR m IN SELECT DISTINCT ON (model_id) model_id, vector_dims(embedding) AS dims
             FROM memory_index_unpartitioned ORDER BY model_id LOOP
        EXECUTE format(
            'CREATE INDEX %I ON memory_index USING hnsw ((embedding::vector(%s)) vector_cosine_ops)'
            ' WHERE model_id = %L',
            'memory_index_hnsw_' || left(md5(m.model_id), 12), m.dims, m.model_id);
    END LOOP;
END $$;

-- The old table goes with its shared graph and any per-person partial indexes.
DROP TABLE memory_index_unpartitioned;
