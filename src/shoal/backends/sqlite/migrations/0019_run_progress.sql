-- shoal schema version 19: a run's progress (ctx.progress).
--
-- A run row keeps the latest progress an execution of it reported: progress is the JSON text of
-- {"fraction", "message", "data"}, progress_at when the run reported it (the app's clock). Both
-- are written by record_progress, fenced like every write of a running run, at most about once a
-- second per run; the latest value only, never a history. Rows written before this migration,
-- and runs that never reported any, leave them NULL.

ALTER TABLE runs ADD COLUMN progress TEXT;
ALTER TABLE runs ADD COLUMN progress_at REAL;
