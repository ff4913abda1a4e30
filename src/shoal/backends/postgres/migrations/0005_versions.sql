-- shoal schema version 5: why a run is delivered again (observers' on_run_resume). The same column
-- as SQLite's: dispatched (first start, or a retry), woke, resumed, recovered; set by the claim.

ALTER TABLE runs ADD COLUMN resume_reason text;
