-- shoal schema version 15: what the console reads (shoal.ports.RunInspection) by an index. Runs
-- newest first by a status runs pass through rarely (failed, cancelled, sleeping, waiting,
-- interrupted); queued, running and succeeded runs are found by walking runs_namespace newest
-- first, where they are the bulk of the newest rows, and indexing them would cost every dispatch
-- and every claim one more index write. By idempotency key alone, by concurrency key alone; and
-- a run's pauses, resolved ones included.

CREATE INDEX runs_status ON runs (namespace, status, id)
    WHERE status IN ('failed', 'cancelled', 'sleeping', 'waiting', 'interrupted');
CREATE INDEX runs_idempotency_key ON runs (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_concurrency_key ON runs (namespace, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL;
CREATE INDEX pauses_run ON pauses (run_id, created_at);
