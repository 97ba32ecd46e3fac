-- The journal's core: runs, their events, and content-addressed artifacts.
-- PostgreSQL's migrations mirror migrations/sqlite, one file for one file
-- (same numbers, same tables and columns); integers are BIGINT throughout.
-- Times are integer microseconds since the Unix epoch (UTC).

CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    thread_id       TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    model_route     TEXT NOT NULL,
    state           TEXT NOT NULL,
    state_version   BIGINT NOT NULL,   -- compare-and-set token, +1 per commit
    last_seq        BIGINT NOT NULL,   -- seq of the run's newest event
    reason          TEXT,
    step            BIGINT NOT NULL DEFAULT 0,
    attempt         BIGINT NOT NULL DEFAULT 0,
    model_attempts  BIGINT NOT NULL DEFAULT 0,
    tool_calls      BIGINT NOT NULL DEFAULT 0,
    tokens_in       BIGINT NOT NULL DEFAULT 0,
    tokens_out      BIGINT NOT NULL DEFAULT 0,
    cost_usd        DOUBLE PRECISION NOT NULL DEFAULT 0,
    reward          DOUBLE PRECISION,               -- an imported run's outcome score
    waiting_json    TEXT,               -- the current wait, while the run waits
    started_at      BIGINT NOT NULL,
    ended_at        BIGINT,
    updated_at      BIGINT NOT NULL,
    spec_json       TEXT NOT NULL,      -- what the run was asked to do (canonical JSON)
    schema_version  BIGINT NOT NULL
);

CREATE INDEX runs_by_state ON runs (state);

CREATE TABLE events (
    run_id          TEXT NOT NULL REFERENCES runs (run_id),
    seq             BIGINT NOT NULL,   -- 1, 2, 3, ... per run, no gaps
    ts              BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    from_state      TEXT,
    to_state        TEXT,
    step            BIGINT NOT NULL,
    attempt         BIGINT NOT NULL,
    state_version   BIGINT NOT NULL,   -- the run's state_version after the commit
    payload_json    TEXT NOT NULL,
    schema_version  BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE artifacts (
    artifact_seq    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- order of storing; the recorder exports by its ranges
    artifact_id     TEXT NOT NULL UNIQUE, -- sha256 of the canonical bytes of body
    kind            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    size_bytes      BIGINT NOT NULL,
    body            TEXT NOT NULL,      -- canonical JSON
    first_run_id    TEXT NOT NULL,      -- the run whose commit stored it first
    first_seq       BIGINT NOT NULL,   -- ... and that commit's last event seq
    schema_version  BIGINT NOT NULL
);
