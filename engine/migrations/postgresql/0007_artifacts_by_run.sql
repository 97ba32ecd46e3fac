-- The recorder exports artifacts with the run and seq of the commit that
-- stored them first, inside the export's per-run ranges, rather than by a
-- range of artifact_seq (on PostgreSQL, numbers are handed out before their
-- transactions commit, not in commit order).

CREATE INDEX artifacts_by_first_run ON artifacts (first_run_id, first_seq);
