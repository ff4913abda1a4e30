-- shoal schema version 26: at most N first starts of a workflow per window (rate_limit).
--
-- rate_key is the key its workflow's rate_limit counts a run's first start under (Rate.key of
-- its input, set at dispatch, never ''; NULL: the runs without a key, and every run written
-- before this version). A claim counts the runs of a (workflow, rate key) whose started_at
-- (the first start) lies in the window: runs_rate_starts walks just those (coalesce: NULL
-- keys compare equal, and '' is no key).

ALTER TABLE runs ADD COLUMN rate_key text;
CREATE INDEX runs_rate_starts ON runs (namespace, workflow, (coalesce(rate_key, '')), started_at)
    WHERE started_at IS NOT NULL;
