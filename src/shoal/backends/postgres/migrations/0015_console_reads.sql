-- shoal schema version 15: what the console reads (shoal.ports.RunInspection) by an index. Runs
-- newest first by status (every status but succeeded, the bulk: a succeeded run is found by
-- walking runs_namespace, where nearly every row is one), by idempotency key alone, by
-- concurrency key alone; and a run's pauses, resolved ones included.

CREATE INDEX runs_status ON runs (namespace, status, id) WHERE status <> 'succeeded';
CREATE INDEX runs_idempotency_key ON runs (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_concurrency_key ON runs (namespace, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL;
CREATE INDEX pauses_run ON pauses (run_id, created_at);
