-- shoal schema version 18: a step's timeline (the console's run detail).
--
-- A step row keeps, besides its end (finished_at) and the lease epoch that wrote it, when its
-- function began on the app's clock (started_at; for a step retried in place, its first try; for
-- a sleep, wait, approval or child wait, when the run first reached it), the run's attempt that
-- executed it, and how many in-place retries it took. All three are written by the checkpoint
-- that writes the step. Rows written by older code (before this migration) leave them NULL.

ALTER TABLE steps ADD COLUMN started_at double precision;
ALTER TABLE steps ADD COLUMN attempt integer;
ALTER TABLE steps ADD COLUMN retries integer;
