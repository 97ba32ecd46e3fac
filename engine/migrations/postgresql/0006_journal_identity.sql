-- A journal's identity: a random id made once, when the journal is created
-- (or upgraded). A traces folder records the id of the journal it exports
-- from, so a second journal can never overwrite its segments.

CREATE TABLE journal_identity (
    journal_id      TEXT NOT NULL,
    schema_version  BIGINT NOT NULL
);

INSERT INTO journal_identity (journal_id, schema_version) VALUES (substr(md5(random()::text || clock_timestamp()::text), 1, 16), 1);
