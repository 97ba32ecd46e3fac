-- The system prompt a run and each of its candidates used, by content:
-- two runs that both say prompt version "v2" can be told apart when the
-- prompt file changed between them.

ALTER TABLE runs ADD COLUMN prompt_hash TEXT;

ALTER TABLE candidates ADD COLUMN prompt_hash TEXT;
