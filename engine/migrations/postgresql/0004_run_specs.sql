-- A run's spec (the scenario it was asked to do, model script included) is
-- written once; the run row is rewritten by every commit. Keeping the spec
-- in the row made each commit copy it again, so a long script made every
-- commit of its run slower. It moves to a table of its own.

CREATE TABLE run_specs (
    run_id          TEXT PRIMARY KEY REFERENCES runs (run_id),
    spec_json       TEXT NOT NULL,      -- what the run was asked to do (canonical JSON)
    schema_version  BIGINT NOT NULL
);

INSERT INTO run_specs (run_id, spec_json, schema_version)
SELECT run_id, spec_json, schema_version FROM runs;

ALTER TABLE runs DROP COLUMN spec_json;
