-- shoal schema version 26: at most N first starts of a workflow per window (rate_limit).
--
-- rate_key is the key its workflow's rate_limit counts a run's first start under: Rate.key of
-- its input, set at dispatch, or '' (no key) for a run of a workflow with a rate and no key
-- function; the flow claim's first start of a run of a rated workflow sets a NULL one to ''
-- (a run dispatched before its workflow had a rate). NULL: a run of a workflow without a rate.
-- A claim counts the runs of a (workflow, rate key) whose started_at (the first start) lies in
-- the window: runs_rate_starts walks just those, and holds only the runs of rated workflows,
-- so that a run of a workflow without a rate writes no entry in it.

ALTER TABLE runs ADD COLUMN rate_key text;
CREATE INDEX runs_rate_starts ON runs (namespace, workflow, rate_key, started_at)
    WHERE rate_key IS NOT NULL AND started_at IS NOT NULL;
