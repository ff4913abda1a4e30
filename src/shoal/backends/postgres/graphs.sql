-- LangGraph checkpoints (shoal.ports.GraphCheckpoints) on PostgreSQL: the statements of graphs.py.
-- Every statement is scoped by the namespace and the tenant given.
--
-- A fenced write (a run id given) locks the run row FOR SHARE in its own statement and
-- writes only while the run is running under that owner and epoch: a claim by another instance
-- (an UPDATE of the row) waits for this statement's transaction, or this statement waits for the
-- claim and then sees the row as the claim left it, so a write never lands after the run was
-- taken over (invariant 1). Each such statement answers "held".

-- name: graph_put_checkpoint
WITH fence AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM runs
        WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s
          AND status = 'running'
        FOR SHARE) r
), written AS (
    INSERT INTO graph_checkpoints (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id,
                                   parent_id, run_id, type, checkpoint, metadata, created_at)
    SELECT %(namespace)s, %(tenant)s, %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s,
           %(parent_id)s, %(graph_run_id)s, %(type)s, %(checkpoint)s, %(metadata)s::jsonb,
           %(created_at)s
    WHERE %(run_id)s::text IS NULL OR (SELECT n FROM fence) = 1
    ON CONFLICT (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_id = excluded.parent_id, run_id = excluded.run_id, type = excluded.type,
        checkpoint = excluded.checkpoint, metadata = excluded.metadata,
        created_at = excluded.created_at
)
SELECT %(run_id)s::text IS NULL OR n = 1 AS held FROM fence;

-- name: graph_put_writes
-- One row per write, the columns as arrays. A task's write (idx >= 0) is written once; a special
-- channel's (idx < 0) is replaced.
WITH fence AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM runs
        WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s
          AND status = 'running'
        FOR SHARE) r
), written AS (
    INSERT INTO graph_writes (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id,
                              task_id, idx, channel, type, value, task_path)
    SELECT %(namespace)s, %(tenant)s, %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s,
           w.task_id, w.idx, w.channel, w.type, w.value, w.task_path
    FROM unnest(%(task_ids)s::text[], %(idxs)s::integer[], %(channels)s::text[],
                %(types)s::text[], %(values)s::bytea[], %(task_paths)s::text[])
         AS w (task_id, idx, channel, type, value, task_path)
    WHERE %(run_id)s::text IS NULL OR (SELECT n FROM fence) = 1
    ON CONFLICT (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    DO UPDATE SET channel = excluded.channel, type = excluded.type, value = excluded.value,
                  task_path = excluded.task_path
    WHERE excluded.idx < 0
)
SELECT %(run_id)s::text IS NULL OR n = 1 AS held FROM fence;

-- name: graph_checkpoints
-- The checkpoints asked for, newest first, each with its pending writes as arrays in
-- (task_path, task_id, idx) order. The metadata given (or NULL) must be contained in the
-- checkpoint's metadata (jsonb @>).
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.run_id, c.type,
       c.checkpoint, c.metadata, c.created_at,
       coalesce(w.task_ids, '{}') AS task_ids, coalesce(w.idxs, '{}') AS idxs,
       coalesce(w.channels, '{}') AS channels, coalesce(w.types, '{}') AS types,
       coalesce(w.vals, '{}') AS vals, coalesce(w.task_paths, '{}') AS task_paths
FROM (
    SELECT * FROM graph_checkpoints
    WHERE namespace = %(namespace)s AND tenant = %(tenant)s
      AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
      AND (%(checkpoint_ns)s::text IS NULL OR checkpoint_ns = %(checkpoint_ns)s)
      AND (%(checkpoint_id)s::text IS NULL OR checkpoint_id = %(checkpoint_id)s)
      AND (%(before)s::text IS NULL OR checkpoint_id < %(before)s)
      AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
    ORDER BY checkpoint_id DESC
    LIMIT %(limit)s
) c
LEFT JOIN LATERAL (
    SELECT array_agg(task_id ORDER BY task_path, task_id, idx) AS task_ids,
           array_agg(idx ORDER BY task_path, task_id, idx) AS idxs,
           array_agg(channel ORDER BY task_path, task_id, idx) AS channels,
           array_agg(type ORDER BY task_path, task_id, idx) AS types,
           array_agg(value ORDER BY task_path, task_id, idx) AS vals,
           array_agg(task_path ORDER BY task_path, task_id, idx) AS task_paths
    FROM graph_writes g
    WHERE g.namespace = %(namespace)s AND g.tenant = %(tenant)s AND g.thread_id = c.thread_id
      AND g.checkpoint_ns = c.checkpoint_ns AND g.checkpoint_id = c.checkpoint_id
) w ON TRUE
ORDER BY c.checkpoint_id DESC;

-- name: graph_delete_thread_writes
DELETE FROM graph_writes
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND thread_id = ANY(%(thread_ids)s);

-- name: graph_delete_thread_checkpoints
DELETE FROM graph_checkpoints
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND thread_id = ANY(%(thread_ids)s);

-- name: graph_delete_run_writes
DELETE FROM graph_writes w
USING graph_checkpoints c
WHERE c.namespace = %(namespace)s AND c.tenant = %(tenant)s AND c.run_id = ANY(%(run_ids)s)
  AND w.namespace = c.namespace AND w.tenant = c.tenant AND w.thread_id = c.thread_id
  AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id;

-- name: graph_delete_run_checkpoints
DELETE FROM graph_checkpoints
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND run_id = ANY(%(run_ids)s);

-- name: graph_copy_checkpoints
INSERT INTO graph_checkpoints (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id,
                               parent_id, run_id, type, checkpoint, metadata, created_at)
SELECT namespace, tenant, %(target)s, checkpoint_ns, checkpoint_id, parent_id, run_id, type,
       checkpoint, metadata, created_at
FROM graph_checkpoints
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND thread_id = %(source)s
ON CONFLICT (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id, type = excluded.type,
    checkpoint = excluded.checkpoint, metadata = excluded.metadata,
    created_at = excluded.created_at;

-- name: graph_copy_writes
INSERT INTO graph_writes (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id,
                          idx, channel, type, value, task_path)
SELECT namespace, tenant, %(target)s, checkpoint_ns, checkpoint_id, task_id, idx, channel,
       type, value, task_path
FROM graph_writes
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND thread_id = %(source)s
ON CONFLICT (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
DO UPDATE SET channel = excluded.channel, type = excluded.type, value = excluded.value,
              task_path = excluded.task_path;

-- name: graph_prune_writes
-- The writes of every checkpoint of these threads but the latest of each checkpoint namespace.
DELETE FROM graph_writes w
USING (SELECT thread_id, checkpoint_ns, max(checkpoint_id) AS latest FROM graph_checkpoints
       WHERE namespace = %(namespace)s AND tenant = %(tenant)s
         AND thread_id = ANY(%(thread_ids)s)
       GROUP BY thread_id, checkpoint_ns) k
WHERE w.namespace = %(namespace)s AND w.tenant = %(tenant)s AND w.thread_id = k.thread_id
  AND w.checkpoint_ns = k.checkpoint_ns AND w.checkpoint_id < k.latest;

-- name: graph_prune_checkpoints
DELETE FROM graph_checkpoints c
USING (SELECT thread_id, checkpoint_ns, max(checkpoint_id) AS latest FROM graph_checkpoints
       WHERE namespace = %(namespace)s AND tenant = %(tenant)s
         AND thread_id = ANY(%(thread_ids)s)
       GROUP BY thread_id, checkpoint_ns) k
WHERE c.namespace = %(namespace)s AND c.tenant = %(tenant)s AND c.thread_id = k.thread_id
  AND c.checkpoint_ns = k.checkpoint_ns AND c.checkpoint_id < k.latest;
