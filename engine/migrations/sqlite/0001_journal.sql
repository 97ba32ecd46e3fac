-- The journal's core: runs, their events, and content-addressed artifacts.
-- Times are integer microseconds since the Unix epoch (UTC).

CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    thread_id       TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    model_route     TEXT NOT NULL,
    state           TEXT NOT NULL,
    state_version   INTEGER NOT NULL,   -- compare-and-set token, +1 per commit
    last_seq        INTEGER NOT NULL,   -- seq of the run's newest event
    reason          TEXT,
    step            INTEGER NOT NULL DEFAULT 0,
    attempt         INTEGER NOT NULL DEFAULT 0,
    model_attempts  INTEGER NOT NULL DEFAULT 0,
    tool_calls      INTEGER NOT NULL DEFAULT 0,
    tokens_in       INTEGER NOT NULL DEFAULT 0,
    tokens_out      INTEGER NOT NULL DEFAULT 0,
    cost_usd        REAL NOT NULL DEFAULT 0,
    reward          REAL,               -- an imported run's outcome score
    waiting_json    TEXT,               -- the current wait, while the run waits
    started_at      INTEGER NOT NULL,
    ended_at        INTEGER,
    updated_at      INTEGER NOT NULL,
    spec_json       TEXT NOT NULL,      -- what the run was asked to do (canonical JSON)
    schema_version  INTEGER NOT NULL
);

CREATE INDEX runs_by_state ON runs (state);

CREATE TABLE events (
    run_id          TEXT NOT NULL REFERENCES runs (run_id),
    seq             INTEGER NOT NULL,   -- 1, 2, 3, ... per run, no gaps
    ts              INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    from_state      TEXT,
    to_state        TEXT,
    step            INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    state_version   INTEGER NOT NULL,   -- the run's state_version after the commit
    payload_json    TEXT NOT NULL,
    schema_version  INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE artifacts (
    artifact_seq    INTEGER PRIMARY KEY, -- order of storing; the recorder exports by its ranges
    artifact_id     TEXT NOT NULL UNIQUE, -- sha256 of the canonical bytes of body
    kind            TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    size_bytes      INTEGER NOT NULL,
    body            TEXT NOT NULL,      -- canonical JSON
    first_run_id    TEXT NOT NULL,      -- the run whose commit stored it first
    first_seq       INTEGER NOT NULL,   -- ... and that commit's last event seq
    schema_version  INTEGER NOT NULL
);  -- a rowid table: bodies are large, and WITHOUT ROWID suits small rows only
