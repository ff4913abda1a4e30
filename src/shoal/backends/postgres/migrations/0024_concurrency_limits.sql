-- shoal schema version 24: up to N runs of one concurrency key at once (concurrency_limit).
--
-- key_slot is which of its key's N places a run holds, from its first start until it ends: 0
-- for a workflow that allows one run of a key (every run written before this version), the
-- smallest free one in [0, N) for a workflow that allows N. runs_key_holder is unique per
-- (namespace, workflow, key, slot), so the database itself refuses an N+1th holder, however
-- many replicas claim at once.

ALTER TABLE runs ADD COLUMN key_slot integer NOT NULL DEFAULT 0;
DROP INDEX runs_key_holder;
CREATE UNIQUE INDEX runs_key_holder ON runs (namespace, workflow, concurrency_key, key_slot)
    WHERE concurrency_key IS NOT NULL AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted');
