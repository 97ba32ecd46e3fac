-- Bookkeeping of the Parquet recorder. An export is first recorded as an
-- intent with the exact ranges it covers (per-run event seqs; artifact and
-- label sequence numbers); its files are named after its id,
-- so redoing an interrupted export rewrites the same files instead of adding
-- rows. Marks advance only when the export is done.

CREATE TABLE export_marks (
    run_id      TEXT PRIMARY KEY,
    events_hwm  INTEGER NOT NULL    -- every event with seq <= this is in Parquet
) WITHOUT ROWID;

CREATE TABLE exports (
    export_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at  INTEGER NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'done')),
    ranges_json TEXT NOT NULL,      -- [[run_id, after_seq, upto_seq], ...]
    bounds_json TEXT NOT NULL       -- {"artifacts": [after, upto], "labels": [after, upto]}
);

-- A compaction merges a table's segment files into one. The merged file is
-- published first, then the files it replaces are deleted; a compaction
-- interrupted between the two is finished by the next export.
CREATE TABLE compactions (
    compaction_id INTEGER PRIMARY KEY AUTOINCREMENT,
    table_name    TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('pending', 'published', 'done')),
    files_json    TEXT NOT NULL,    -- the segment files it replaces
    created_at    INTEGER NOT NULL
);
