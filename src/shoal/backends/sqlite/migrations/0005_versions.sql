-- shoal schema version 5: why a run is delivered again (observers' on_run_resume).

ALTER TABLE runs ADD COLUMN resume_reason TEXT;
