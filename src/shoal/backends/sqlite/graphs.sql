-- LangGraph checkpoints (shoal.ports.GraphCheckpoints) on SQLite: the statements of graphs.py.
-- Every statement is scoped by :namespace and :tenant. A list of ids is one JSON array parameter,
-- read with json_each.

-- name: graph_fence
SELECT 1 FROM runs
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: graph_put_checkpoint
INSERT INTO graph_checkpoints (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id,
                               parent_id, run_id, type, checkpoint, metadata, created_at)
VALUES (:namespace, :tenant, :thread_id, :checkpoint_ns, :checkpoint_id, :parent_id, :run_id,
        :type, :checkpoint, :metadata, :created_at)
ON CONFLICT (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id, type = excluded.type,
    checkpoint = excluded.checkpoint, metadata = excluded.metadata,
    created_at = excluded.created_at;

-- name: graph_put_write
-- A task's write (idx >= 0) is written once; a special channel's (idx < 0) is replaced.
INSERT INTO graph_writes (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id,
                          idx, channel, type, value, task_path)
VALUES (:namespace, :tenant, :thread_id, :checkpoint_ns, :checkpoint_id, :task_id, :idx,
        :channel, :type, :value, :task_path)
ON CONFLICT (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
DO UPDATE SET channel = excluded.channel, type = excluded.type, value = excluded.value,
              task_path = excluded.task_path
WHERE excluded.idx < 0;

-- name: graph_checkpoint
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_id, run_id, type, checkpoint, metadata,
       created_at
FROM graph_checkpoints
WHERE namespace = :namespace AND tenant = :tenant AND thread_id = :thread_id
  AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id;

-- name: graph_latest
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_id, run_id, type, checkpoint, metadata,
       created_at
FROM graph_checkpoints
WHERE namespace = :namespace AND tenant = :tenant AND thread_id = :thread_id
  AND checkpoint_ns = :checkpoint_ns
ORDER BY checkpoint_id DESC LIMIT 1;

-- name: graph_list
-- :metadata is a JSON object (or NULL): each of its keys must be in the checkpoint's metadata
-- with an equal value (an integer equals a real of the same value; objects and arrays compare
-- as JSON text). :limit -1 is no limit.
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_id, run_id, type, checkpoint, metadata,
       created_at
FROM graph_checkpoints c
WHERE namespace = :namespace AND tenant = :tenant
  AND (:thread_id IS NULL OR thread_id = :thread_id)
  AND (:checkpoint_ns IS NULL OR checkpoint_ns = :checkpoint_ns)
  AND (:checkpoint_id IS NULL OR checkpoint_id = :checkpoint_id)
  AND (:before IS NULL OR checkpoint_id < :before)
  AND (:metadata IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(:metadata) f
        WHERE NOT EXISTS (
            SELECT 1 FROM json_each(c.metadata) m
            WHERE m.key = f.key AND m.value IS f.value
              AND (m.type = f.type OR (m.type IN ('integer', 'real')
                                       AND f.type IN ('integer', 'real'))))))
ORDER BY checkpoint_id DESC
LIMIT :limit;

-- name: graph_writes
SELECT task_id, idx, channel, type, value, task_path FROM graph_writes
WHERE namespace = :namespace AND tenant = :tenant AND thread_id = :thread_id
  AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id
ORDER BY task_path, task_id, idx;

-- name: graph_delete_thread_writes
DELETE FROM graph_writes
WHERE namespace = :namespace AND tenant = :tenant
  AND thread_id IN (SELECT value FROM json_each(:thread_ids));

-- name: graph_delete_thread_checkpoints
DELETE FROM graph_checkpoints
WHERE namespace = :namespace AND tenant = :tenant
  AND thread_id IN (SELECT value FROM json_each(:thread_ids));

-- name: graph_delete_run_writes
DELETE FROM graph_writes
WHERE namespace = :namespace AND tenant = :tenant
  AND (thread_id, checkpoint_ns, checkpoint_id) IN (
      SELECT thread_id, checkpoint_ns, checkpoint_id FROM graph_checkpoints
      WHERE namespace = :namespace AND tenant = :tenant
        AND run_id IN (SELECT value FROM json_each(:run_ids)));

-- name: graph_delete_run_checkpoints
DELETE FROM graph_checkpoints
WHERE namespace = :namespace AND tenant = :tenant
  AND run_id IN (SELECT value FROM json_each(:run_ids));

-- name: graph_copy_checkpoints
INSERT OR REPLACE INTO graph_checkpoints
    (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, parent_id, run_id, type,
     checkpoint, metadata, created_at)
SELECT namespace, tenant, :target, checkpoint_ns, checkpoint_id, parent_id, run_id, type,
       checkpoint, metadata, created_at
FROM graph_checkpoints
WHERE namespace = :namespace AND tenant = :tenant AND thread_id = :source;

-- name: graph_copy_writes
INSERT OR REPLACE INTO graph_writes
    (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
     value, task_path)
SELECT namespace, tenant, :target, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
       value, task_path
FROM graph_writes
WHERE namespace = :namespace AND tenant = :tenant AND thread_id = :source;

-- name: graph_prune_writes
-- The writes of every checkpoint of these threads but the latest of each checkpoint namespace.
DELETE FROM graph_writes
WHERE namespace = :namespace AND tenant = :tenant
  AND thread_id IN (SELECT value FROM json_each(:thread_ids))
  AND checkpoint_id < (
      SELECT max(c.checkpoint_id) FROM graph_checkpoints c
      WHERE c.namespace = :namespace AND c.tenant = :tenant
        AND c.thread_id = graph_writes.thread_id
        AND c.checkpoint_ns = graph_writes.checkpoint_ns);

-- name: graph_prune_checkpoints
DELETE FROM graph_checkpoints
WHERE namespace = :namespace AND tenant = :tenant
  AND thread_id IN (SELECT value FROM json_each(:thread_ids))
  AND checkpoint_id < (
      SELECT max(c.checkpoint_id) FROM graph_checkpoints c
      WHERE c.namespace = :namespace AND c.tenant = :tenant
        AND c.thread_id = graph_checkpoints.thread_id
        AND c.checkpoint_ns = graph_checkpoints.checkpoint_ns);

-- name: graph_prune_run_writes
-- With prune_runs, before the runs go: the graphs of the runs :ids (run_graph's thread is the
-- run, in its namespace and tenant).
DELETE FROM graph_writes
WHERE (namespace, tenant, thread_id) IN (
    SELECT namespace, tenant, id FROM runs WHERE id IN (SELECT value FROM json_each(:ids)));

-- name: graph_prune_run_checkpoints
DELETE FROM graph_checkpoints
WHERE (namespace, tenant, thread_id) IN (
    SELECT namespace, tenant, id FROM runs WHERE id IN (SELECT value FROM json_each(:ids)));
