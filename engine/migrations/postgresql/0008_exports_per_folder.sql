-- What the recorder exported is tracked per traces folder: several data
-- directories may share one journal (a PostgreSQL journal used from many
-- machines, or one --store file), and each folder must get every row. A
-- folder's id is in its .journal file; the one folder of an older journal
-- keeps the id ''.

CREATE TABLE export_marks_by_folder (
    traces_id   TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    events_hwm  BIGINT NOT NULL,   -- every event with seq <= this is in that folder's Parquet
    PRIMARY KEY (traces_id, run_id)
);

INSERT INTO export_marks_by_folder (traces_id, run_id, events_hwm)
SELECT '', run_id, events_hwm FROM export_marks;

DROP TABLE export_marks;

ALTER TABLE export_marks_by_folder RENAME TO export_marks;

ALTER TABLE exports ADD COLUMN traces_id TEXT NOT NULL DEFAULT '';

ALTER TABLE compactions ADD COLUMN traces_id TEXT NOT NULL DEFAULT '';
