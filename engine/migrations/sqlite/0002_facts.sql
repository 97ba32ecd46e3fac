-- Facts the engine records beside its events. Append-only rows carry the seq
-- of the commit that wrote them, so the recorder can export them by range.

CREATE TABLE candidates (
    run_id              TEXT NOT NULL REFERENCES runs (run_id),
    step                INTEGER NOT NULL,
    attempt             INTEGER NOT NULL,
    candidate_id        TEXT NOT NULL,
    context_artifact_id TEXT NOT NULL,
    finish_reason       TEXT NOT NULL,
    items_json          TEXT NOT NULL,
    prompt_version      TEXT NOT NULL,
    model_route         TEXT NOT NULL,
    tokens_in           INTEGER NOT NULL DEFAULT 0,
    tokens_out          INTEGER NOT NULL DEFAULT 0,
    cost_usd            REAL NOT NULL DEFAULT 0,
    seq                 INTEGER NOT NULL,
    schema_version      INTEGER NOT NULL,
    PRIMARY KEY (run_id, step, attempt)
);

CREATE TABLE validations (
    run_id            TEXT NOT NULL REFERENCES runs (run_id),
    step              INTEGER NOT NULL,
    attempt           INTEGER NOT NULL,
    candidate_id      TEXT NOT NULL,
    validator         TEXT NOT NULL,
    validator_version TEXT NOT NULL,
    suite_version     TEXT NOT NULL,
    verdict           TEXT NOT NULL CHECK (verdict IN ('accept', 'repair', 'ask', 'reject')),
    code              TEXT NOT NULL,
    message           TEXT NOT NULL,
    evidence_json     TEXT NOT NULL,
    seq               INTEGER NOT NULL,
    schema_version    INTEGER NOT NULL
);

CREATE INDEX validations_by_run ON validations (run_id, seq);

-- Operations are the one mutable fact: an operation advances from
-- committed-before-dispatch to its terminal outcome. The idempotency key is
-- unique, so a second record of the same side effect is refused.
CREATE TABLE operations (
    operation_id        TEXT PRIMARY KEY,
    run_id              TEXT NOT NULL REFERENCES runs (run_id),
    step                INTEGER NOT NULL,
    call_id             TEXT,
    tool                TEXT NOT NULL,
    tool_version        TEXT,
    idempotency_key     TEXT NOT NULL UNIQUE,
    canonical_args_json TEXT NOT NULL,
    expected_resource_version TEXT,
    policy_decision     TEXT NOT NULL,
    status              TEXT NOT NULL,
    outcome             TEXT,
    dispatch_count      INTEGER NOT NULL DEFAULT 0,
    result_artifact_id  TEXT,
    work_id             TEXT,
    created_seq         INTEGER NOT NULL,
    updated_seq         INTEGER NOT NULL,
    schema_version      INTEGER NOT NULL
);

CREATE INDEX operations_by_run ON operations (run_id, created_seq);

CREATE TABLE loop_diagnoses (
    run_id           TEXT NOT NULL REFERENCES runs (run_id),
    step             INTEGER NOT NULL,
    detector         TEXT NOT NULL,
    detector_version TEXT NOT NULL,
    pattern          TEXT NOT NULL,
    evidence_json    TEXT NOT NULL,
    seq              INTEGER NOT NULL,
    schema_version   INTEGER NOT NULL
);

CREATE INDEX loop_diagnoses_by_run ON loop_diagnoses (run_id, seq);

-- Judgements of what a decision should have been. Not tied to a run's
-- commits: a human or an importer adds them at any time.
CREATE TABLE labels (
    label_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT NOT NULL,
    step            INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    candidate_id    TEXT NOT NULL,
    validator       TEXT NOT NULL DEFAULT '',
    expected_verdict TEXT NOT NULL CHECK (expected_verdict IN ('accept', 'repair', 'ask', 'reject')),
    source          TEXT NOT NULL CHECK (source IN ('human', 'scenario', 'import')),
    note            TEXT NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    schema_version  INTEGER NOT NULL
);
