-- Named statements of the PostgreSQL store. Each block starts with "-- name: NAME".
-- Placeholders are psycopg's %(name)s; %(name)b sends the value in binary (the arrays of the
-- batched statements, each element of which the text format would quote and escape in Python).
-- Every statement runs on a connection whose search_path is
-- the store's schema. A statement that may make work due for another instance calls
-- pg_notify(%(channel)s, ''), delivered when its transaction commits.
--
-- A statement that makes runs final (settle, recover, cancel), makes final runs live again
-- (retry) or deletes them (prune_runs) also records them in run_counts, for stats: one delta row
-- per (namespace, workflow, status, second they finished) of the runs it changed, +n or -n. The
-- store's connections set shoal.counted to 'on', which keeps the triggers of schema version 14
-- (one row per run, for other sessions) out of it. A new statement that changes whether runs
-- are final must do the same.

-- name: insert_run
-- A conflicting idempotency key inserts nothing (and waits for an in-flight insert of the key).
WITH inserted AS (
    INSERT INTO runs (id, namespace, tenant, workflow, input, status, priority, created_at,
                      run_at, max_attempts, concurrency_key, idempotency_key, version, parent_id,
                      root_id, held, trace_context, rate_key)
    VALUES (%(id)s, %(namespace)s, %(tenant)s, %(workflow)s, %(input)s, 'queued', %(priority)s,
            %(created_at)s, %(run_at)s, %(max_attempts)s, %(concurrency_key)s,
            %(idempotency_key)s, %(version)s, %(parent_id)s, %(root_id)s, %(held)s,
            %(trace_context)s, %(rate_key)s)
    ON CONFLICT (namespace, tenant, workflow, idempotency_key)
        WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
)
SELECT inserted.*, CASE WHEN NOT inserted.held THEN pg_notify(%(channel)s, '') END AS notified
FROM inserted;

-- name: insert_runs
-- create_runs in one statement: the batch is one JSON array of rows (no idempotency key twice in
-- it; a row's input is its JSON text, as a string), each row inserted unless its key is taken
-- (waiting for an in-flight insert of the key, as insert_run does). Returns the ids inserted,
-- and sends one NOTIFY for the whole batch when a row it inserted is not held. The caller reads
-- the runs of the keys that were taken with find_idempotent_many, as create_run does.
WITH inserted AS (
    INSERT INTO runs (id, namespace, tenant, workflow, input, status, priority, created_at,
                      run_at, max_attempts, concurrency_key, idempotency_key, version, parent_id,
                      root_id, held, trace_context, rate_key)
    SELECT id, %(namespace)s, tenant, workflow, input, 'queued', priority, created_at, run_at,
           max_attempts, concurrency_key, idempotency_key, version, parent_id, root_id, held,
           trace_context, rate_key
    FROM json_to_recordset(%(rows)s::json)
        AS b(id text, tenant text, workflow text, input text, priority integer,
             created_at double precision, run_at double precision, max_attempts integer,
             concurrency_key text, idempotency_key text, version text, parent_id text,
             root_id text, held boolean, trace_context text, rate_key text)
    ON CONFLICT (namespace, tenant, workflow, idempotency_key)
        WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, held
)
SELECT id,
       (SELECT count(*) FROM (SELECT pg_notify(%(channel)s, '')
                              WHERE EXISTS (SELECT 1 FROM inserted WHERE NOT held)) n) AS notified
FROM inserted;

-- name: copy_runs
-- create_runs of a batch without idempotency keys (nothing to conflict on) and of at least
-- _COPY_MIN runs, in the transaction that then sends notify: COPY is the cheapest way in (half
-- the server time of insert_runs per row). The columns of insert_runs, in its order.
COPY runs (id, namespace, tenant, workflow, input, status, priority, created_at, run_at,
           max_attempts, concurrency_key, idempotency_key, version, parent_id, root_id, held,
           trace_context, rate_key)
FROM STDIN;

-- name: notify
SELECT pg_notify(%(channel)s, '');

-- name: find_idempotent_many
-- The runs of these (tenant, workflow, idempotency key) triples, one index probe each (LIMIT 1
-- keeps the lateral a probe: the planner would otherwise be free to join the whole table).
SELECT stored.*
FROM unnest(%(tenant)s::text[], %(workflow)s::text[], %(idempotency_key)s::text[])
    AS k(tenant, workflow, idempotency_key)
CROSS JOIN LATERAL (
    SELECT * FROM runs r
    WHERE r.namespace = %(namespace)s AND r.tenant = k.tenant AND r.workflow = k.workflow
      AND r.idempotency_key = k.idempotency_key
    LIMIT 1) stored;

-- name: find_idempotent
SELECT * FROM runs
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND workflow = %(workflow)s
  AND idempotency_key = %(idempotency_key)s;

-- name: database_identity
-- The server (by its start time), the database and whether the schema holds a shoal store: what a
-- caller's connection (app.dispatch(..., connection=conn)) must share with the store's. Catalogs
-- and built-in functions only: it cannot fail, so it never aborts the caller's transaction.
SELECT current_database() AS database,
       (SELECT oid FROM pg_database WHERE datname = current_database()) AS database_oid,
       pg_postmaster_start_time() AS started,
       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %(schema)s AND c.relname = 'shoal_migrations') AS has_store;

-- name: advisory_xact_lock
-- Held until the transaction ends: serializes migrations per schema and admission per namespace.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: count_queued
-- What admission control counts: queued runs never started (a retry is not waiting for admission),
-- and parked runs; each counted up to max_queued only, which is all admission needs to know, so
-- the cost does not grow with a long queue.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM runs
        WHERE namespace = %(namespace)s AND status = 'queued' AND NOT held
          AND started_at IS NULL
        LIMIT %(max_queued)s) q) AS queued,
    (SELECT count(*) FROM (
        SELECT 1 FROM runs WHERE namespace = %(namespace)s AND held
        LIMIT %(max_queued)s) p) AS parked;

-- name: get_run
SELECT * FROM runs WHERE id = %(id)s;

-- name: claim
-- One statement: lock due runs in claim order (skipping rows another claimer holds), then set them
-- running. A queued run with a concurrency key is a candidate when it holds the key itself
-- (started before), or when no started, unfinished run holds the key and it is the first due
-- unstarted run of the key, so a batch takes at most one run per key. runs_key_holder backs this
-- when two claims race. A run that has started is claimed only by the code version that started
-- it (a replay on other code could diverge), unless its workflow is in any_version; its first
-- claim stamps it with the claimer's version. A run of a paused workflow is no candidate (one
-- probe of paused_workflows' primary key). The SET reads the row as it was before the update.
-- A claimer serving a workflow with a concurrency_limit above 1 runs claim_limited instead, this
-- statement with the key's condition and its slot made for N holders (runs.py: _limited).
WITH queued AS (
    SELECT r.id, r.priority, r.created_at FROM runs r
    WHERE r.namespace = %(namespace)s AND r.status = 'queued' AND NOT r.held
      AND r.run_at <= %(now)s AND r.workflow = ANY(%(workflows)s::text[])
      AND (r.started_at IS NULL OR r.version IS NOT DISTINCT FROM %(version)s::text
           OR r.workflow = ANY(%(any_version)s::text[]))
      -- a run that started before (waiting for its retry) holds its own key
      AND (r.concurrency_key IS NULL OR r.started_at IS NOT NULL OR (
            NOT EXISTS (
                SELECT 1 FROM runs h
                WHERE h.namespace = r.namespace AND h.workflow = r.workflow
                  AND h.concurrency_key = r.concurrency_key AND h.id <> r.id
                  -- runs_key_holder's predicate, so that this is one probe of that index
                  AND h.concurrency_key IS NOT NULL AND h.started_at IS NOT NULL
                  AND h.status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted'))
            -- walks runs_key_queued in claim order and stops at the first due run of the key
            AND r.id = (
                SELECT e.id FROM runs e
                WHERE e.namespace = r.namespace AND e.workflow = r.workflow
                  AND e.concurrency_key = r.concurrency_key
                  AND e.status = 'queued' AND e.started_at IS NULL AND NOT e.held
                  AND e.run_at <= %(now)s
                  -- a paused tenant's run does not stand in front of another tenant's
                  AND NOT EXISTS (SELECT FROM paused_workflows p
                                  WHERE (p.namespace, p.workflow, p.tenant)
                                      = (e.namespace, e.workflow, e.tenant))
                ORDER BY e.priority DESC, e.created_at, e.id
                LIMIT 1)))
      AND NOT EXISTS (SELECT FROM paused_workflows p
                      WHERE (p.namespace, p.workflow) = (r.namespace, r.workflow)
                        AND p.tenant IN ('', r.tenant))
    ORDER BY r.priority DESC, r.created_at, r.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), timed AS (
    -- a sleeping or waiting run holds its own key: nothing else of the key can be live
    SELECT r.id, r.priority, r.created_at FROM runs r
    WHERE r.namespace = %(namespace)s AND r.status IN ('sleeping', 'waiting')
      AND r.run_at <= %(now)s AND r.workflow = ANY(%(workflows)s::text[])
      -- sleeping or waiting: started, so only its own version
      AND (r.version IS NOT DISTINCT FROM %(version)s::text
           OR r.workflow = ANY(%(any_version)s::text[]))
      AND NOT EXISTS (SELECT FROM paused_workflows p
                      WHERE (p.namespace, p.workflow) = (r.namespace, r.workflow)
                        AND p.tenant IN ('', r.tenant))
    ORDER BY r.priority DESC, r.created_at, r.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), chosen AS (
    SELECT c.id FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c
    ORDER BY c.priority DESC, c.created_at, c.id
    LIMIT %(limit)s
)
UPDATE runs
SET status = 'running', owner = %(owner)s, lease_expires_at = %(expires)s,
    lease_epoch = runs.lease_epoch + 1, attempts = greatest(runs.attempts, 1),
    started_at = coalesce(runs.started_at, %(now)s), wait_for = NULL, run_at = %(now)s,
    -- a first start holds the key's one slot (a run of a limit above 1 before may have had another)
    key_slot = CASE WHEN runs.started_at IS NULL THEN 0 ELSE runs.key_slot END,
    -- a run takes the version of the code that first executes it
    version = CASE WHEN runs.started_at IS NULL THEN %(version)s::text ELSE runs.version END,
    resume_reason = CASE WHEN runs.status = 'sleeping' THEN 'woke'
                         WHEN runs.status = 'waiting' THEN 'resumed'
                         -- retried (retry_run) or dispatched: never started before
                         WHEN runs.started_at IS NULL THEN coalesce(runs.resume_reason, 'dispatched')
                         ELSE coalesce(runs.resume_reason, 'recovered') END
FROM chosen
WHERE runs.id = chosen.id
RETURNING runs.*;

-- name: incompatible_runs
-- Due, started runs of these workflows that the claim leaves to another code version (to log
-- them): the claim's two scans (runs_queued, runs_timed) without the version filter, inverted.
SELECT * FROM (
    SELECT * FROM runs
    WHERE namespace = %(namespace)s AND status = 'queued' AND NOT held AND run_at <= %(now)s
      AND started_at IS NOT NULL
    UNION ALL
    SELECT * FROM runs
    WHERE namespace = %(namespace)s AND status IN ('sleeping', 'waiting') AND run_at <= %(now)s
) r
WHERE r.version IS DISTINCT FROM %(version)s::text
  AND r.workflow = ANY(%(workflows)s::text[])
  AND NOT (r.workflow = ANY(%(any_version)s::text[]))
ORDER BY r.priority DESC, r.created_at, r.id
LIMIT %(limit)s;

-- name: renew
-- Rows are locked in id order, like a batch of settlements of the same instance. The update
-- finds the rows locked by primary key (see settle: a join through the runs_claimed index was
-- quadratic in the runs running).
WITH l AS (
    SELECT * FROM unnest(%(ids)b::text[], %(epochs)b::bigint[]) AS l(id, epoch)
), fenced AS (
    SELECT r.id, l.epoch FROM runs r JOIN l ON l.id = r.id
    WHERE r.lease_epoch = l.epoch AND r.owner = %(owner)s AND r.status = 'running'
    ORDER BY r.id
    FOR UPDATE OF r
)
UPDATE runs SET lease_expires_at = %(expires)s
FROM fenced
WHERE runs.id = fenced.id AND runs.owner = %(owner)s AND runs.lease_epoch = fenced.epoch
RETURNING runs.id, runs.cancel_requested;

-- name: load_steps
SELECT seq, name, output, finished, epoch, started_at, attempt, retries FROM steps
WHERE run_id = %(run_id)s ORDER BY seq;

-- name: checkpoint
-- The checkpoints of several runs in one statement, one commit (a batch), one per run: for
-- each, the lease check, the lease extension and the step write. Rows are locked in id order.
-- fenced carries each locked row's checkpoint, so that nothing joins two CTEs (the planner
-- expects one row from each, and chose nested loops quadratic in the batch; see settle). A row
-- locked here is this statement's until the commit, so the rows fenced are the rows extended.
WITH c AS (
    SELECT * FROM unnest(%(id)b::text[], %(owner)b::text[], %(epoch)b::bigint[],
                         %(expires)b::double precision[], %(seq)b::integer[], %(name)b::text[],
                         %(output)b::text[], %(finished)b::boolean[],
                         %(finished_at)b::double precision[], %(started_at)b::double precision[],
                         %(attempt)b::integer[], %(retries)b::integer[])
        AS c(id, owner, epoch, expires, seq, name, output, finished, finished_at, started_at,
             attempt, retries)
), fenced AS (
    SELECT r.id, c.owner, c.epoch, c.expires, c.seq, c.name, c.output, c.finished,
           c.finished_at, c.started_at, c.attempt, c.retries
    FROM runs r JOIN c ON c.id = r.id
    WHERE r.owner = c.owner AND r.lease_epoch = c.epoch AND r.status = 'running'
    ORDER BY r.id
    FOR UPDATE OF r
), extended AS (
    UPDATE runs SET lease_expires_at = f.expires
    FROM fenced f
    WHERE runs.id = f.id AND runs.owner = f.owner AND runs.lease_epoch = f.epoch
    RETURNING runs.id
), put AS (
    INSERT INTO steps (run_id, seq, name, output, finished, epoch, finished_at, started_at,
                       attempt, retries)
    SELECT id, seq, name, output, finished, epoch, finished_at, started_at, attempt, retries
    FROM fenced
    ON CONFLICT (run_id, seq) DO UPDATE
    SET name = excluded.name, output = excluded.output, finished = excluded.finished,
        epoch = excluded.epoch, finished_at = excluded.finished_at,
        started_at = excluded.started_at, attempt = excluded.attempt, retries = excluded.retries
    WHERE NOT steps.finished
)
SELECT id FROM extended;

-- name: record_progress
-- The progress of several runs in one statement (a batch), one per run, each under its fence.
-- Rows are locked in id order, as the checkpoint batch locks them, so the two never deadlock.
WITH p AS (
    SELECT * FROM unnest(%(id)b::text[], %(owner)b::text[], %(epoch)b::bigint[],
                         %(progress)b::text[], %(progress_at)b::double precision[])
        AS p(id, owner, epoch, progress, progress_at)
), fenced AS (
    SELECT r.id, p.progress, p.progress_at
    FROM runs r JOIN p ON p.id = r.id
    WHERE r.owner = p.owner AND r.lease_epoch = p.epoch AND r.status = 'running'
    ORDER BY r.id
    FOR UPDATE OF r
)
UPDATE runs SET progress = f.progress, progress_at = f.progress_at
FROM fenced f
WHERE runs.id = f.id
RETURNING runs.id;

-- name: suspend
-- Under the fence: record the unfinished step and set the run sleeping/waiting, without a claim.
WITH fenced AS (
    UPDATE runs
    SET status = %(status)s, run_at = %(run_at)s, wait_for = %(wait_for)s, owner = NULL,
        lease_expires_at = NULL
    WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s
      AND status = 'running'
    RETURNING id
), put AS (
    INSERT INTO steps (run_id, seq, name, output, finished, epoch, finished_at, started_at,
                       attempt, retries)
    SELECT fenced.id, %(seq)s::integer, %(name)s::text, %(output)s::text, %(finished)s::boolean,
           %(epoch)s::bigint, %(finished_at)s::double precision,
           %(started_at)s::double precision, %(attempt)s::integer, %(retries)s::integer
    FROM fenced
    ON CONFLICT (run_id, seq) DO UPDATE
    SET name = excluded.name, output = excluded.output, finished = excluded.finished,
        epoch = excluded.epoch, finished_at = excluded.finished_at,
        started_at = excluded.started_at, attempt = excluded.attempt, retries = excluded.retries
    WHERE NOT steps.finished
)
SELECT count(*) AS held FROM fenced;

-- name: fence_lock
-- Locks the run row, so a concurrent send_signal waits for this transaction (no lost wake-up).
SELECT id FROM runs
WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s AND status = 'running'
FOR UPDATE;

-- name: put_step
INSERT INTO steps (run_id, seq, name, output, finished, epoch, finished_at, started_at,
                   attempt, retries)
VALUES (%(run_id)s, %(seq)s, %(name)s, %(output)s, %(finished)s, %(epoch)s, %(finished_at)s,
        %(started_at)s, %(attempt)s, %(retries)s)
ON CONFLICT (run_id, seq) DO UPDATE
SET name = excluded.name, output = excluded.output, finished = excluded.finished,
    epoch = excluded.epoch, finished_at = excluded.finished_at,
    started_at = excluded.started_at, attempt = excluded.attempt, retries = excluded.retries
WHERE NOT steps.finished;

-- name: consume_signal
-- Only under the run's row lock (fence_lock), so no two consumers race for one signal.
UPDATE signals SET consumed = true
WHERE id = (SELECT id FROM signals
            WHERE run_id = %(run_id)s AND name = %(name)s AND NOT consumed
            ORDER BY created_at, id LIMIT 1)
RETURNING payload;

-- name: settle
-- The settlements of several runs in one statement, one commit (a batch); each row is still
-- fenced on its own owner and epoch. Rows are locked in id order, like renew, so two batches
-- never wait for each other in a cycle. fenced carries each locked row's settlement, so that
-- counted and the update read it without joining s again: the planner expects one row from a
-- CTE, and a join of two CTEs (or of a CTE and the runs of the runs_claimed index) became a
-- nested loop, quadratic in the batch (100 settlements: 2 of the statement's 3.4 ms). The
-- update finds its rows by id alone (the primary key); the fence was checked on the row locked,
-- and is checked again, by owner and epoch, on the version the update changes.
WITH s AS (
    SELECT * FROM unnest(%(id)b::text[], %(owner)b::text[], %(epoch)b::bigint[],
                         %(status)b::text[], %(output)b::text[], %(error)b::text[],
                         %(finished_at)b::float8[], %(run_at)b::float8[],
                         %(attempt_inc)b::int4[], %(traceback)b::text[])
        AS s(id, owner, epoch, status, output, error, finished_at, run_at, attempt_inc,
             traceback)
), fenced AS (
    SELECT r.id, r.namespace, r.workflow, s.owner, s.epoch, s.status, s.output, s.error,
           s.finished_at, s.run_at, s.attempt_inc, s.traceback
    FROM runs r JOIN s ON s.id = r.id
    WHERE r.owner = s.owner AND r.lease_epoch = s.epoch AND r.status = 'running'
    ORDER BY r.id
    FOR UPDATE OF r
), counted AS (
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    SELECT namespace, workflow, status, floor(finished_at), count(*)
    FROM fenced
    WHERE status IN ('succeeded', 'failed', 'cancelled')
    GROUP BY namespace, workflow, status, floor(finished_at)
)
UPDATE runs
SET status = f.status, output = f.output, error = f.error, traceback = f.traceback,
    finished_at = f.finished_at,
    run_at = f.run_at, attempts = runs.attempts + f.attempt_inc, owner = NULL,
    lease_expires_at = NULL,
    -- a retry is delivered again as dispatched
    resume_reason = CASE WHEN f.status = 'queued' THEN 'dispatched' ELSE runs.resume_reason END
FROM fenced f
WHERE runs.id = f.id AND runs.owner = f.owner AND runs.lease_epoch = f.epoch
RETURNING runs.id,
    -- a freed concurrency key or a requeued run is work for another instance
    CASE WHEN runs.concurrency_key IS NOT NULL OR runs.status = 'queued'
         THEN pg_notify(%(channel)s, '') END AS notified;

-- name: release
UPDATE runs SET status = 'interrupted', owner = NULL, lease_expires_at = NULL
WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s AND status = 'running'
RETURNING id, pg_notify(%(channel)s, '') AS notified;

-- name: recover
-- A claim that expired is a crash: the attempt counts, and past max_attempts the run fails.
-- A released claim (interrupted) is requeued as it was, or cancelled if that was asked.
-- Rows another transaction holds are skipped: they are recovered by a later poll.
WITH due AS (
    SELECT id FROM runs
    WHERE namespace = %(namespace)s
      AND ((status = 'running' AND lease_expires_at <= %(now)s) OR status = 'interrupted')
    ORDER BY id
    FOR UPDATE SKIP LOCKED
), recovered AS (
    UPDATE runs r
    SET status = CASE
            WHEN r.status = 'running' AND r.attempts >= r.max_attempts THEN 'failed'
            WHEN r.status = 'interrupted' AND r.cancel_requested THEN 'cancelled'
            ELSE 'queued' END,
        attempts = CASE WHEN r.status = 'running' AND r.attempts < r.max_attempts
                        THEN r.attempts + 1 ELSE r.attempts END,
        error = CASE
            WHEN r.status = 'running' AND r.attempts >= r.max_attempts
            THEN 'the instance executing attempt ' || r.attempts || ' of ' || r.max_attempts
                 || ' stopped (crashed or lost its lease); no attempts are left'
            ELSE r.error END,
        traceback = CASE WHEN r.status = 'running' AND r.attempts >= r.max_attempts THEN NULL
                         ELSE r.traceback END,
        finished_at = CASE
            WHEN (r.status = 'running' AND r.attempts >= r.max_attempts)
                 OR (r.status = 'interrupted' AND r.cancel_requested) THEN %(now)s
            ELSE r.finished_at END,
        run_at = CASE
            WHEN (r.status = 'running' AND r.attempts < r.max_attempts)
                 OR (r.status = 'interrupted' AND NOT r.cancel_requested) THEN %(now)s
            ELSE r.run_at END,
        -- a requeued run is delivered again as recovered
        resume_reason = CASE
            WHEN (r.status = 'running' AND r.attempts < r.max_attempts)
                 OR (r.status = 'interrupted' AND NOT r.cancel_requested) THEN 'recovered'
            ELSE r.resume_reason END,
        owner = NULL, lease_expires_at = NULL
    FROM due
    WHERE r.id = due.id
    RETURNING r.*
), counted AS (
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    SELECT namespace, workflow, status, floor(finished_at), count(*) FROM recovered
    WHERE status IN ('succeeded', 'failed', 'cancelled')
    GROUP BY namespace, workflow, status, floor(finished_at)
)
SELECT recovered.*, pg_notify(%(channel)s, '') AS notified FROM recovered;

-- name: cancel
-- Queued, sleeping, waiting or interrupted: cancelled at once, and the run's pending pauses are
-- resolved as cancelled (run rows are locked before pause rows, as resolve_pause locks them).
-- Running: asked of its owner. An unfinished root takes every unfinished run of its tree with it
-- the same way: the root's row is locked first, then the tree's in id order. Each run that ends
-- here wakes a parent waiting for it (the runs_ended trigger).
WITH target AS MATERIALIZED (
    SELECT id, root_id FROM runs
    WHERE id = %(id)s AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
    FOR UPDATE
), tree AS MATERIALIZED (
    -- runs_children's predicate (id <> root_id), so that this is one probe of that index
    SELECT r.id FROM runs r JOIN target t ON r.root_id = t.id
    WHERE t.id = t.root_id AND r.id <> r.root_id
      AND r.status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
    ORDER BY r.id
    FOR UPDATE OF r
), cancelled AS (
    UPDATE runs
    SET status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
        cancel_requested = true,
        finished_at = CASE WHEN status = 'running' THEN finished_at ELSE %(now)s END,
        held = CASE WHEN status = 'running' THEN held ELSE false END,
        owner = CASE WHEN status = 'running' THEN owner END,
        lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at END
    WHERE id IN (SELECT id FROM target UNION ALL SELECT id FROM tree)
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
    RETURNING *
), counted AS (
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    SELECT namespace, workflow, status, floor(finished_at), count(*) FROM cancelled
    WHERE status = 'cancelled'
    GROUP BY namespace, workflow, status, floor(finished_at)
), unpaused AS (
    UPDATE pauses SET status = 'resolved', resolved_at = %(now)s,
        decision = '{"approved":false,"data":null,"by":null,"reason":"cancelled"}'
    FROM cancelled
    WHERE pauses.run_id = cancelled.id AND cancelled.status = 'cancelled'
      AND pauses.status = 'pending'
    RETURNING pauses.id
)
SELECT cancelled.*,
    -- a cancelled run may free a concurrency key (or an admission place)
    CASE WHEN EXISTS (SELECT 1 FROM cancelled c WHERE c.status = 'cancelled')
         THEN pg_notify(%(channel)s, '') END AS notified,
    (SELECT count(*) FROM unpaused) AS unpaused
FROM cancelled
WHERE cancelled.id = %(id)s;

-- name: retry
-- A failed or cancelled run queued again, not started (the claim takes its concurrency key and
-- version as a new run's), its unfinished steps dropped (a sleep, wait, approval or child wait
-- in progress starts over). The row lock makes two racing calls wait for each other: the second
-- finds the run queued and changes nothing.
WITH target AS MATERIALIZED (
    SELECT id, namespace, workflow, status, finished_at FROM runs
    WHERE id = %(id)s AND namespace = %(namespace)s
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND status IN ('failed', 'cancelled')
    FOR UPDATE
), uncounted AS (
    -- the row as locked: its status and end before this update
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    SELECT namespace, workflow, status, floor(finished_at), -1 FROM target
), dropped AS (
    DELETE FROM steps USING target WHERE steps.run_id = target.id AND NOT steps.finished
)
UPDATE runs
SET status = 'queued', attempts = 0, run_at = %(now)s, started_at = NULL, finished_at = NULL,
    output = NULL, owner = NULL, lease_expires_at = NULL, wait_for = NULL,
    cancel_requested = false, held = false, resume_reason = 'retried'
FROM target
WHERE runs.id = target.id
RETURNING runs.*, pg_notify(%(channel)s, '') AS notified;

-- name: lock_run
-- Taken by send_signal before it looks at the run: wait_signal holds the same lock while it
-- decides to park, so a signal either is seen by it or wakes the parked run.
SELECT * FROM runs WHERE id = %(id)s FOR UPDATE;

-- name: signal_and_wake
WITH inserted AS (
    INSERT INTO signals (id, run_id, name, payload, created_at)
    VALUES (%(id)s, %(run_id)s, %(name)s, %(payload)s, %(now)s)
)
UPDATE runs SET run_at = %(now)s
WHERE id = %(run_id)s AND status = 'waiting' AND wait_for = %(name)s
RETURNING *, pg_notify(%(channel)s, '') AS notified;

-- name: release_held
WITH picked AS (
    SELECT id FROM runs WHERE namespace = %(namespace)s AND held
    ORDER BY created_at, id
    LIMIT %(n)s
    FOR UPDATE
)
UPDATE runs SET held = false FROM picked
WHERE runs.id = picked.id
RETURNING runs.id, pg_notify(%(channel)s, '') AS notified;

-- name: register_workflows
INSERT INTO workflows (namespace, name, options, registered_at)
SELECT %(namespace)s, w.name, w.options, %(now)s
FROM unnest(%(names)s::text[], %(options)s::text[]) AS w(name, options)
ORDER BY w.name
ON CONFLICT (namespace, name) DO UPDATE
SET options = excluded.options, registered_at = excluded.registered_at;

-- name: get_workflow
SELECT options FROM workflows WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: register_workflow_instances
INSERT INTO workflow_instances (namespace, workflow, instance, registered_at)
SELECT %(namespace)s, w.name, %(instance)s, %(now)s
FROM unnest(%(names)s::text[]) AS w(name)
ORDER BY w.name
ON CONFLICT (namespace, workflow, instance) DO UPDATE SET registered_at = excluded.registered_at;

-- name: forget_workflow_instances
DELETE FROM workflow_instances WHERE namespace = %(namespace)s AND registered_at < %(before)s;

-- name: list_workflows
SELECT namespace, name, options, registered_at FROM workflows
WHERE %(namespace)s::text IS NULL OR namespace = %(namespace)s
ORDER BY namespace, name;

-- name: list_workflow_instances
SELECT namespace, workflow, instance, registered_at FROM workflow_instances
WHERE %(namespace)s::text IS NULL OR namespace = %(namespace)s
ORDER BY namespace, workflow, registered_at DESC, instance;

-- name: set_tenant_weight
INSERT INTO tenant_weights (namespace, tenant, weight)
VALUES (%(namespace)s, %(tenant)s, %(weight)s)
ON CONFLICT (namespace, tenant) DO UPDATE SET weight = excluded.weight;

-- name: clear_tenant_weight
-- 1 is the default: no row
DELETE FROM tenant_weights WHERE namespace = %(namespace)s AND tenant = %(tenant)s;

-- name: tenant_weights
SELECT tenant, weight FROM tenant_weights WHERE namespace = %(namespace)s ORDER BY tenant;

-- name: pause_workflow
INSERT INTO paused_workflows (namespace, workflow, tenant, paused_at)
VALUES (%(namespace)s, %(workflow)s, %(tenant)s, %(now)s)
ON CONFLICT (namespace, workflow, tenant) DO NOTHING
RETURNING paused_at;

-- name: resume_workflow
-- The claimers waiting for work look again.
WITH resumed AS (
    DELETE FROM paused_workflows
    WHERE namespace = %(namespace)s AND workflow = %(workflow)s AND tenant = %(tenant)s
    RETURNING 1
)
SELECT pg_notify(%(channel)s, '') FROM resumed;

-- name: paused_workflows
SELECT workflow, tenant, paused_at FROM paused_workflows WHERE namespace = %(namespace)s
ORDER BY workflow, tenant;

-- name: prune_runs
-- A bounded batch of the oldest finished runs with their steps, signals, outbox entries and the
-- LangGraph checkpoints of their graphs (run_graph: the thread is the run, in its tenant); runs
-- another instance is pruning at the same moment are skipped, not waited for.
WITH old AS (
    SELECT id, tenant FROM runs
    WHERE namespace = %(namespace)s AND status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < %(before)s
      -- a run whose outbox entries are still being delivered stays until they are done
      AND NOT EXISTS (SELECT 1 FROM outbox o
                      WHERE o.run_id = runs.id AND o.delivered_at IS NULL AND NOT o.dead)
    ORDER BY finished_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone_steps AS (
    DELETE FROM steps WHERE run_id IN (SELECT id FROM old)
), gone_signals AS (
    DELETE FROM signals WHERE run_id IN (SELECT id FROM old)
), gone_outbox AS (
    DELETE FROM outbox WHERE run_id IN (SELECT id FROM old)
), gone_tree_keys AS (
    -- none, but those stored by shoal code older than schema version 16 during a rollout
    DELETE FROM tree_keys WHERE root_id IN (SELECT id FROM old)
), gone_graph_writes AS (
    DELETE FROM graph_writes w USING old
    WHERE w.namespace = %(namespace)s AND w.tenant = old.tenant AND w.thread_id = old.id
), gone_graph_checkpoints AS (
    DELETE FROM graph_checkpoints c USING old
    WHERE c.namespace = %(namespace)s AND c.tenant = old.tenant AND c.thread_id = old.id
), gone AS (
    DELETE FROM runs WHERE id IN (SELECT id FROM old)
    RETURNING id, namespace, workflow, status, finished_at
), uncounted AS (
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    SELECT namespace, workflow, status, floor(finished_at), -count(*) FROM gone
    GROUP BY namespace, workflow, status, floor(finished_at)
)
SELECT id FROM gone;

-- name: stats
-- One statement, one snapshot. Live runs are counted from their rows, each branch of "live" one
-- scan of a partial index (runs_queued, runs_held, runs_timed, runs_claimed: its predicate
-- repeated), so the cost follows the live runs, never the final ones; final runs from the
-- run_counts rows of the namespace (a few per workflow and status once folded). Due: queued
-- (not held) or sleeping/waiting with run_at <= now; oldest_due is the earliest run_at of a due
-- run. Pauses and the outbox through their partial indexes (pauses_pending, outbox_due,
-- outbox_dead). A part with nothing in it has no row (pauses, outbox, dead: always one).
WITH live AS (
    SELECT status, workflow, tenant, false AS held, run_at FROM runs
    WHERE namespace = %(namespace)s AND status = 'queued' AND NOT held
    UNION ALL
    SELECT status, workflow, tenant, true, NULL FROM runs
    WHERE namespace = %(namespace)s AND held
    UNION ALL
    SELECT status, workflow, tenant, false, run_at FROM runs
    WHERE namespace = %(namespace)s AND status IN ('sleeping', 'waiting') AND NOT held
    UNION ALL
    SELECT status, workflow, tenant, false, NULL FROM runs
    WHERE namespace = %(namespace)s AND status IN ('running', 'interrupted') AND NOT held
)
SELECT 'live' AS part, status, workflow, tenant, held, count(*) AS n,
       count(*) FILTER (WHERE run_at <= %(now)s) AS due,
       min(run_at) FILTER (WHERE run_at <= %(now)s) AS oldest_due
FROM live
GROUP BY status, workflow, tenant, held
UNION ALL
SELECT 'final', status, workflow, NULL, false, sum(n)::bigint,
       coalesce(sum(n) FILTER (WHERE bucket >= %(since)s), 0)::bigint, NULL
FROM run_counts
WHERE namespace = %(namespace)s
GROUP BY status, workflow
UNION ALL
SELECT 'pauses', NULL, NULL, NULL, false, count(*), 0, NULL FROM pauses
WHERE namespace = %(namespace)s AND status = 'pending'
UNION ALL
SELECT 'outbox', NULL, NULL, NULL, false, count(*), 0, NULL FROM outbox
WHERE namespace = %(namespace)s AND delivered_at IS NULL AND NOT dead
UNION ALL
SELECT 'dead', NULL, NULL, NULL, false, count(*), 0, NULL FROM outbox
WHERE namespace = %(namespace)s AND dead;

-- name: fold_needed
-- Whether fold_counts has anything to do: a (workflow, status, second) with several rows, a
-- second older than :keep not folded yet, or a sum of 0 (rows that can go).
SELECT 1 AS due FROM run_counts
WHERE namespace = %(namespace)s
GROUP BY workflow, status, CASE WHEN bucket >= %(keep)s THEN bucket END
HAVING count(*) > 1 OR min(bucket) < %(keep)s OR sum(n) = 0
LIMIT 1;

-- name: fold_counts
-- The namespace's rows, replaced by their sums: one per (workflow, status, second) from :keep
-- on, one per (workflow, status) before (bucket NULL); none for a sum of 0. Only the rows this
-- statement deletes are summed: delta rows committed meanwhile are left for the next fold, and
-- rows another fold deleted first are skipped (after waiting for it), so nothing is counted
-- twice. A reader sees the rows before or after, never between.
WITH gone AS (
    DELETE FROM run_counts WHERE namespace = %(namespace)s
    RETURNING workflow, status, CASE WHEN bucket >= %(keep)s THEN bucket END AS bucket, n
)
INSERT INTO run_counts (namespace, workflow, status, bucket, n)
SELECT %(namespace)s, workflow, status, bucket, sum(n) FROM gone
GROUP BY workflow, status, bucket
HAVING sum(n) <> 0;

-- name: park_on_pause
-- Under the fence, one statement: park the run waiting for the pause (no deadline: expiry
-- resolves the pause), record the unfinished step and insert the pending pause. The pause is
-- visible only with the run parked, so a resolution always finds the run waiting for it.
WITH fenced AS (
    UPDATE runs
    SET status = 'waiting', run_at = NULL, wait_for = %(wait_for)s, owner = NULL,
        lease_expires_at = NULL
    WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s
      AND status = 'running'
    RETURNING id
), put AS (
    INSERT INTO steps (run_id, seq, name, output, finished, epoch, finished_at, started_at,
                       attempt, retries)
    SELECT fenced.id, %(seq)s::integer, %(name)s::text, %(output)s::text, %(finished)s::boolean,
           %(epoch)s::bigint, %(finished_at)s::double precision,
           %(started_at)s::double precision, %(attempt)s::integer, %(retries)s::integer
    FROM fenced
    ON CONFLICT (run_id, seq) DO UPDATE
    SET name = excluded.name, output = excluded.output, finished = excluded.finished,
        epoch = excluded.epoch, finished_at = excluded.finished_at,
        started_at = excluded.started_at, attempt = excluded.attempt, retries = excluded.retries
    WHERE NOT steps.finished
), paused AS (
    INSERT INTO pauses (id, namespace, tenant, run_id, name, request, status, created_at,
                        expires_at)
    SELECT %(pause_id)s, %(namespace)s, %(tenant)s, fenced.id, %(pause_name)s, %(request)s,
           'pending', %(created_at)s, %(expires_at)s
    FROM fenced
)
SELECT count(*) AS held FROM fenced;

-- name: get_pause
SELECT * FROM pauses WHERE id = %(id)s;

-- name: lock_pause_run
-- Taken by resolve_pause before it resolves: the run row is always locked before its pauses
-- (as cancel does), so a resolution racing a park or a cancellation waits for it.
SELECT id FROM runs WHERE id = (SELECT run_id FROM pauses WHERE id = %(id)s) FOR UPDATE;

-- name: resolve_pause
-- Exactly once: only a pending pause is resolved; its run, waiting for it, is due at once.
WITH resolved AS (
    UPDATE pauses SET status = 'resolved', decision = %(decision)s, resolved_at = %(now)s
    WHERE id = %(id)s AND status = 'pending'
    RETURNING *
), woken AS (
    UPDATE runs SET run_at = %(now)s
    FROM resolved
    WHERE runs.id = resolved.run_id AND runs.status = 'waiting'
      AND runs.wait_for = 'shoal.pause:' || resolved.id
    RETURNING runs.id, pg_notify(%(channel)s, '') AS notified
)
SELECT resolved.*, (SELECT count(*) FROM woken) AS woken FROM resolved;

-- name: list_pauses
SELECT * FROM pauses
WHERE namespace = %(namespace)s AND status = 'pending'
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: expiring_pauses
SELECT 1 AS due FROM pauses
WHERE namespace = %(namespace)s AND status = 'pending' AND expires_at <= %(now)s
LIMIT 1;

-- name: lock_expiring_runs
-- The runs of the expired pauses, locked in id order (two instances expiring at once never wait
-- for each other in a cycle) before their pauses, as resolve_pause and cancel lock them.
SELECT id FROM runs
WHERE id IN (SELECT run_id FROM pauses
             WHERE namespace = %(namespace)s AND status = 'pending' AND expires_at <= %(now)s)
ORDER BY id
FOR UPDATE;

-- name: expire_pauses
-- Only pauses whose run this transaction locked; one that another instance resolved meanwhile is
-- no longer pending and stays as it is.
WITH resolved AS (
    UPDATE pauses SET status = 'resolved', decision = %(decision)s, resolved_at = %(now)s
    WHERE namespace = %(namespace)s AND status = 'pending' AND expires_at <= %(now)s
      AND run_id = ANY(%(run_ids)s::text[])
    RETURNING *
), woken AS (
    UPDATE runs SET run_at = %(now)s
    FROM resolved
    WHERE runs.id = resolved.run_id AND runs.status = 'waiting'
      AND runs.wait_for = 'shoal.pause:' || resolved.id
    RETURNING runs.id, pg_notify(%(channel)s, '') AS notified
)
SELECT resolved.*, (SELECT count(*) FROM woken) AS woken FROM resolved
ORDER BY resolved.created_at, resolved.id;

-- name: claim_notifications
-- Each pause is taken by one instance for the lease: rows another instance is taking right now
-- are skipped, and a taken row is offered again once its lease has passed (the sender failed).
WITH due AS (
    SELECT id FROM pauses
    WHERE namespace = %(namespace)s AND NOT notified
      AND (notify_until IS NULL OR notify_until <= %(now)s)
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE pauses SET notify_until = %(until)s
FROM due
WHERE pauses.id = due.id
RETURNING pauses.*;

-- name: mark_notified
UPDATE pauses SET notified = true, notify_until = NULL WHERE id = %(id)s;

-- name: prune_pauses
-- A bounded batch of the oldest resolved pauses; those another instance is pruning are skipped.
WITH old AS (
    SELECT id FROM pauses
    WHERE namespace = %(namespace)s AND status = 'resolved' AND resolved_at < %(before)s
    ORDER BY resolved_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pauses WHERE id IN (SELECT id FROM old)
RETURNING id;

-- name: insert_tree_key
-- First wins: an insert racing another of the same key waits for it, then inserts nothing.
-- Only while the root is unfinished (its row updated, so locked: its end waits for this insert
-- and then removes the key with the rest): no key may outlive its tree. The update marks the
-- root as having keys, which is what makes the runs_ended trigger remove them (schema version
-- 16). The key carries the root's tenant, read from that same row.
WITH root AS (
    UPDATE runs SET has_tree_keys = true
    WHERE id = %(root_id)s AND status NOT IN ('succeeded', 'failed', 'cancelled')
    RETURNING tenant
)
INSERT INTO tree_keys (root_id, key, value, claimant, created_at, tenant)
SELECT %(root_id)s, %(key)s, %(value)s, %(claimant)s, %(now)s, tenant FROM root
ON CONFLICT (root_id, key) DO NOTHING
RETURNING claimant;

-- name: get_tree_key
-- A statement of its own after insert_tree_key inserted nothing: its snapshot sees the winner.
SELECT value, claimant FROM tree_keys WHERE root_id = %(root_id)s AND key = %(key)s;

-- name: list_tree_keys
-- In the order of the keys' bytes, as SQLite and the memory store sort them.
SELECT key, tenant FROM tree_keys WHERE root_id = %(root_id)s ORDER BY key COLLATE "C";

-- name: lock_child
-- Taken by wait_child under the parent's fence_lock, before it decides to park: a statement ending
-- the child waits for this transaction, so its runs_ended trigger finds the parent parked; or the
-- child ended first, and this returns it final (the lock is granted on its newest version).
SELECT * FROM runs WHERE id = %(id)s FOR SHARE;

-- name: fence_extend
-- The fence of a transaction that writes more than one statement: extends the lease and locks the
-- run row until the commit, so the transaction's later statements see every write of the run
-- committed before it.
UPDATE runs SET lease_expires_at = %(expires)s
WHERE id = %(run_id)s AND owner = %(owner)s AND lease_epoch = %(epoch)s AND status = 'running'
RETURNING id;

-- name: checkpoint_outbox
-- After fence_extend, in its transaction (so this statement's snapshot is taken with the run row
-- locked): the step's outbox entries, only if the step is not finished already (invariant 3: a
-- finished step's entries were written with it), once per (run_id, seq, idx); then the step.
-- Both parts see the steps as they were before this statement.
WITH sent AS (
    INSERT INTO outbox (id, namespace, run_id, seq, idx, topic, payload, created_at, next_at,
                        trace_context)
    SELECT o.id, o.namespace, o.run_id, o.seq, o.idx, o.topic, o.payload, o.created_at, %(now)s,
           o.trace_context
    FROM unnest(%(o_id)s::text[], %(o_namespace)s::text[], %(o_run_id)s::text[],
                %(o_seq)s::integer[], %(o_idx)s::integer[], %(o_topic)s::text[],
                %(o_payload)s::text[], %(o_created_at)s::double precision[],
                %(o_trace_context)s::text[])
        AS o(id, namespace, run_id, seq, idx, topic, payload, created_at, trace_context)
    WHERE NOT EXISTS (SELECT 1 FROM steps
                      WHERE steps.run_id = %(run_id)s AND steps.seq = %(seq)s AND steps.finished)
    ORDER BY o.run_id, o.seq, o.idx
    ON CONFLICT (run_id, seq, idx) DO NOTHING
)
INSERT INTO steps (run_id, seq, name, output, finished, epoch, finished_at, started_at,
                   attempt, retries)
VALUES (%(run_id)s, %(seq)s, %(name)s, %(output)s, %(finished)s, %(epoch)s, %(finished_at)s,
        %(started_at)s, %(attempt)s, %(retries)s)
ON CONFLICT (run_id, seq) DO UPDATE
SET name = excluded.name, output = excluded.output, finished = excluded.finished,
    epoch = excluded.epoch, finished_at = excluded.finished_at,
    started_at = excluded.started_at, attempt = excluded.attempt, retries = excluded.retries
WHERE NOT steps.finished;

-- name: claim_outbox
-- Due entries of these topics, oldest due first (as on SQLite); each is taken by one instance for
-- the lease: rows another instance is taking right now are skipped, and a row taken and committed
-- since this statement began no longer passes next_at <= now when it is locked, so it is not
-- taken twice. A taken entry is offered again once its lease has passed (the deliverer failed).
WITH due AS (
    SELECT id FROM outbox
    WHERE namespace = %(namespace)s AND delivered_at IS NULL AND NOT dead
      AND next_at <= %(now)s AND topic = ANY(%(topics)s::text[])
    ORDER BY next_at, created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox SET next_at = %(until)s
FROM due
WHERE outbox.id = due.id
RETURNING outbox.*;

-- name: outbox_delivered
-- A late report about an entry delivered or dead already changes nothing.
UPDATE outbox SET delivered_at = %(now)s, error = NULL
WHERE id = %(id)s AND delivered_at IS NULL AND NOT dead;

-- name: outbox_failed
UPDATE outbox
SET attempts = attempts + 1, error = %(error)s, dead = %(dead)s, next_at = %(next_at)s
WHERE id = %(id)s AND delivered_at IS NULL AND NOT dead;

-- name: dead_letters
SELECT * FROM outbox
WHERE namespace = %(namespace)s AND dead
ORDER BY created_at, id
LIMIT %(limit)s;

-- coordination
-- shoal.ports on PostgreSQL (shoal.backends.postgres.coord), with the semantics of the memory
-- reference (shoal.backends.memory.coord). Each operation is one transaction: its statements are
-- sent in one pipeline, which the server runs as one implicit transaction (one round trip). In
-- READ COMMITTED each statement takes its snapshot when it starts, so a statement that follows
-- the one taking the locks sees what every earlier holder of those locks committed. Rows are
-- locked in "C" order of their keys, so two operations never wait for each other in a cycle.

-- name: lock_keys_create
-- The rows of keys never locked before (a row is never deleted: it keeps the fencing counter).
-- Inserted in key order: an insert waits for a concurrent insert of the same key, which only
-- happens before the larger keys of that transaction are taken.
INSERT INTO locks (namespace, key)
SELECT %(namespace)s::text, k FROM unnest(%(keys)s::text[]) AS k
ORDER BY k COLLATE "C"
ON CONFLICT (namespace, key) DO NOTHING;

-- name: lock_keys
-- Every change to a key, its holder or its queue, is made holding this lock on the key's row.
SELECT key FROM locks
WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[])
ORDER BY key COLLATE "C"
FOR UPDATE;

-- name: lock_acquire
-- After lock_keys_create and lock_keys. Expired waiters leave the queues (the caller's own rows
-- are overwritten or deleted below instead: one statement never changes a row twice). The caller
-- keeps its ticket if its waiter row of the first key is live. It is granted every key if none
-- has a live holder and, on each key, the smallest live ticket is its own (no queue, no ticket:
-- first too): the token is one above each key's last, and its waiter rows go. Else it queues on
-- every key with its ticket (a new one, from the namespace's counter, if it had none) and learns
-- when to ask again by itself: the earliest, among its keys, of the lease end of the live holder
-- and of the live waiter right ahead of it, if any (least() skips a NULL).
WITH purged AS (
    DELETE FROM lock_waiters
    WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[]) AND holder <> %(holder)s
      AND expires_at <= %(now)s
), live AS (
    SELECT key, holder, ticket, expires_at FROM lock_waiters
    WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[]) AND expires_at > %(now)s
), keyrows AS (
    SELECT key, holder, token, expires_at FROM locks
    WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[])
), verdict AS (
    SELECT mine.ticket,
           NOT EXISTS (SELECT 1 FROM keyrows WHERE holder IS NOT NULL AND expires_at > %(now)s)
           AND NOT EXISTS (SELECT 1 FROM live GROUP BY key
                           HAVING min(ticket) IS DISTINCT FROM mine.ticket) AS granted,
           (SELECT max(token) FROM keyrows) + 1 AS token
    FROM (SELECT (SELECT ticket FROM live
                  WHERE key = %(first)s AND holder = %(holder)s) AS ticket) mine
), taken AS (
    UPDATE locks SET holder = %(holder)s, token = verdict.token, expires_at = %(until)s
    FROM verdict
    WHERE verdict.granted AND locks.namespace = %(namespace)s
      AND locks.key = ANY(%(keys)s::text[])
), unqueued AS (
    DELETE FROM lock_waiters USING verdict
    WHERE verdict.granted AND lock_waiters.namespace = %(namespace)s
      AND lock_waiters.key = ANY(%(keys)s::text[]) AND lock_waiters.holder = %(holder)s
), numbered AS (
    INSERT INTO lock_tickets AS t (namespace, ticket)
    SELECT %(namespace)s::text, 1 FROM verdict WHERE NOT verdict.granted AND verdict.ticket IS NULL
    ON CONFLICT (namespace) DO UPDATE SET ticket = t.ticket + 1
    RETURNING t.ticket
), place AS (
    SELECT coalesce(verdict.ticket, (SELECT ticket FROM numbered)) AS ticket
    FROM verdict WHERE NOT verdict.granted
), queued AS (
    INSERT INTO lock_waiters (namespace, key, holder, ticket, expires_at)
    SELECT %(namespace)s::text, k, %(holder)s::text, place.ticket, %(until)s::double precision
    FROM place, unnest(%(keys)s::text[]) AS k
    ON CONFLICT (namespace, key, holder) DO UPDATE
    SET ticket = excluded.ticket, expires_at = excluded.expires_at
)
SELECT verdict.granted, verdict.token, place.ticket,
       coalesce((SELECT min(least(
                     (SELECT a.expires_at FROM live AS a
                      WHERE a.key = k AND a.holder <> %(holder)s AND a.ticket < place.ticket
                      ORDER BY a.ticket DESC LIMIT 1),
                     (SELECT r.expires_at FROM keyrows AS r
                      WHERE r.key = k AND r.holder IS NOT NULL AND r.expires_at > %(now)s)))
                 FROM unnest(%(keys)s::text[]) AS k),
                %(until)s) AS retry_at
FROM verdict LEFT JOIN place ON true;

-- name: lock_renew
-- One statement: the rows still held are locked in key order (a row that changed meanwhile is
-- checked again as it is now), and extended only if every key is among them.
WITH held AS (
    SELECT key FROM locks
    WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[]) AND holder = %(holder)s
      AND expires_at > %(now)s
    ORDER BY key COLLATE "C"
    FOR UPDATE
), renewed AS (
    UPDATE locks SET expires_at = %(until)s
    WHERE namespace = %(namespace)s AND key IN (SELECT key FROM held)
      AND (SELECT count(*) FROM held) = cardinality(%(keys)s::text[])
    RETURNING key
)
SELECT count(*) AS renewed FROM renewed;

-- name: lock_release
-- After lock_keys. The hold goes (the fencing counter stays), so do the caller's waiter rows (a
-- waiter that gives up). On each key where the caller held the lock (even with an ended lease)
-- or was the first waiter, and that no one else holds, the new first waiter (smallest ticket, a
-- row whose lease ended counting) is named in a notification sent when the transaction commits
-- (the payload names the waiters, or is 'lock *' when they do not fit: every watch wakes), and
-- returned, for the watches of this store. The snapshot is the one before the changes below.
WITH before AS (
    SELECT k AS key, l.holder,
           (SELECT q.holder FROM lock_waiters AS q
            WHERE q.namespace = %(namespace)s AND q.key = k
            ORDER BY q.ticket LIMIT 1) AS first,
           (SELECT q.holder FROM lock_waiters AS q
            WHERE q.namespace = %(namespace)s AND q.key = k AND q.holder <> %(holder)s
            ORDER BY q.ticket LIMIT 1) AS next
    FROM unnest(%(keys)s::text[]) AS k
    LEFT JOIN locks AS l ON l.namespace = %(namespace)s AND l.key = k
), freed AS (
    UPDATE locks SET holder = NULL, expires_at = 0
    WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[]) AND holder = %(holder)s
), gave_up AS (
    DELETE FROM lock_waiters
    WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[]) AND holder = %(holder)s
), named AS (
    SELECT array_agg(DISTINCT next) AS heads FROM before
    WHERE next IS NOT NULL AND (holder IS NULL OR holder = %(holder)s)
      AND (holder = %(holder)s OR first = %(holder)s)
), payload AS (
    SELECT heads, 'lock ' || json_build_array(%(origin)s::text, %(namespace)s::text, heads)::text
                  AS text
    FROM named WHERE heads IS NOT NULL
)
SELECT heads,
       pg_notify(%(channel)s, CASE WHEN octet_length(text) <= 7999 THEN text ELSE 'lock *' END)
       AS notified
FROM payload;

-- name: lock_heads
-- Without LISTEN (a pooler in transaction mode, no direct_url), what a store's poll asks for
-- the keys its lock watches wait on: the first waiter (smallest ticket, a row whose lease ended
-- counting) of each of them that no one holds, as lock_release names it. A hold whose lease
-- ended is not asked about: its waiters try again when it ends (the retry_at of lock_acquire).
SELECT DISTINCT ON (q.key) q.holder
FROM lock_waiters AS q
LEFT JOIN locks AS l ON l.namespace = q.namespace AND l.key = q.key
WHERE q.namespace = %(namespace)s AND q.key = ANY(%(keys)s::text[]) AND l.holder IS NULL
ORDER BY q.key, q.ticket;

-- name: heartbeat
-- After advisory_xact_lock on the namespace's membership. Members whose row ended are deleted;
-- the caller is upserted (joined_at kept only if its row is live); the roster is the "C"-sorted
-- ids of live members that joined at least warmup ago, stored with the next generation if it
-- changed; the caller is granted the generation if it is on the roster, holds nothing or that
-- generation, and every other live member holds nothing or that generation.
WITH others AS (
    SELECT member, joined_at, held FROM members
    WHERE namespace = %(namespace)s AND member <> %(member)s AND expires_at > %(now)s
), me AS (
    SELECT coalesce((SELECT joined_at FROM members
                     WHERE namespace = %(namespace)s AND member = %(member)s
                       AND expires_at > %(now)s),
                    %(now)s::double precision) AS joined_at
), roster AS (
    SELECT coalesce(array_agg(m.member ORDER BY m.member COLLATE "C"), '{}'::text[]) AS members
    FROM (SELECT member, joined_at FROM others
          UNION ALL
          SELECT %(member)s::text, joined_at FROM me) m
    WHERE m.joined_at + %(warmup)s <= %(now)s
), stored AS (
    SELECT coalesce(r.generation, 0) AS generation, coalesce(r.members, '{}'::text[]) AS members
    FROM (SELECT 1) one LEFT JOIN rosters r ON r.namespace = %(namespace)s
), outcome AS (
    SELECT roster.members, roster.members <> stored.members AS changed,
           stored.generation + CASE WHEN roster.members <> stored.members THEN 1 ELSE 0 END
               AS generation
    FROM roster, stored
), verdict AS (
    SELECT outcome.*,
           %(member)s::text = ANY(outcome.members)
           AND (%(held)s::bigint IS NULL OR %(held)s::bigint = outcome.generation)
           AND NOT EXISTS (SELECT 1 FROM others WHERE others.held <> outcome.generation)
               AS granted
    FROM outcome
), purged AS (
    DELETE FROM members
    WHERE namespace = %(namespace)s AND member <> %(member)s AND expires_at <= %(now)s
), beat AS (
    INSERT INTO members (namespace, member, joined_at, expires_at, held, beat_at, version)
    SELECT %(namespace)s::text, %(member)s::text, me.joined_at, %(until)s::double precision,
           CASE WHEN verdict.granted THEN verdict.generation ELSE %(held)s::bigint END,
           %(now)s::double precision, %(version)s::text
    FROM me, verdict
    ON CONFLICT (namespace, member) DO UPDATE
    SET joined_at = excluded.joined_at, expires_at = excluded.expires_at, held = excluded.held,
        beat_at = excluded.beat_at, version = excluded.version
), saved AS (
    INSERT INTO rosters (namespace, generation, members)
    SELECT %(namespace)s::text, verdict.generation, verdict.members FROM verdict
    WHERE verdict.changed
    ON CONFLICT (namespace) DO UPDATE
    SET generation = excluded.generation, members = excluded.members
)
SELECT generation, members, granted FROM verdict;

-- name: view_roster
-- coordination_view (one REPEATABLE READ READ ONLY transaction: one snapshot for its reads; each
-- only reads, so a read never deletes an ended row, drains a meter or takes a lock).
SELECT generation, members FROM rosters WHERE namespace = %(namespace)s;

-- name: view_members
-- The live members (ended rows stay for the next heartbeat to delete).
SELECT member, joined_at, expires_at, held, beat_at, version FROM members
WHERE namespace = %(namespace)s AND expires_at > %(now)s
ORDER BY member COLLATE "C";

-- name: view_locks_held
-- Keys with a live holder, through locks_held (never every key ever locked), in "C" order.
SELECT key, token, holder, expires_at FROM locks
WHERE namespace = %(namespace)s AND holder IS NOT NULL AND expires_at > %(now)s
ORDER BY key COLLATE "C"
LIMIT %(limit)s;

-- name: view_lock_waiters
-- Live waiters by key and ticket, with their key's last token (0: no row yet). Waiter rows are
-- few: they end with their lease and retention deletes them.
SELECT w.key, w.holder, w.ticket, w.expires_at, coalesce(l.token, 0) AS token
FROM lock_waiters AS w
LEFT JOIN locks AS l ON l.namespace = w.namespace AND l.key = w.key
WHERE w.namespace = %(namespace)s AND w.expires_at > %(now)s
ORDER BY w.key COLLATE "C", w.ticket;

-- name: view_meters
-- Meters still in debt at now, drained as meter drains them (those drained go at retention).
SELECT key, greatest(0, debt - greatest(0, %(now)s - updated_at) * 1000) AS debt, updated_at
FROM meters
WHERE namespace = %(namespace)s AND debt - greatest(0, %(now)s - updated_at) * 1000 > 0
ORDER BY key COLLATE "C"
LIMIT %(limit)s;

-- name: leave
-- After advisory_xact_lock on the namespace's membership, like heartbeat.
DELETE FROM members WHERE namespace = %(namespace)s AND member = %(member)s;

-- name: meter_keys_create
-- The rows of keys never charged (debt 0 as of now), in key order, as lock_keys_create.
INSERT INTO meters (namespace, key, debt, updated_at)
SELECT %(namespace)s::text, d.k, 0, %(now)s::double precision
FROM (SELECT DISTINCT k FROM unnest(%(keys)s::text[]) AS k) d
ORDER BY d.k COLLATE "C"
-- An existing row is locked here already (the WHERE false updates nothing, but DO UPDATE locks the
-- row): prune_coordination could otherwise delete it before meter_keys locks it.
ON CONFLICT (namespace, key) DO UPDATE SET debt = meters.debt WHERE false;

-- name: meter_keys
SELECT key FROM meters
WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[])
ORDER BY key COLLATE "C"
FOR UPDATE;

-- name: meter
-- After meter_keys_create and meter_keys. The charges in request order, a key named twice charged
-- twice: each key's charges are folded in order (the recursion), each step as the memory
-- reference computes it (debt drained by the time since updated_at, floored at 0, plus the delta,
-- floored at 0; updated_at never goes back); each key's last step is stored.
WITH RECURSIVE charge AS (
    SELECT c.key, c.delta, c.i, row_number() OVER (PARTITION BY c.key ORDER BY c.i) AS n
    FROM unnest(%(keys)s::text[], %(deltas)s::double precision[])
        WITH ORDINALITY AS c(key, delta, i)
), charged (key, n, i, debt, updated_at) AS (
    SELECT c.key, c.n, c.i,
           greatest(0, greatest(0, m.debt - greatest(0, %(now)s - m.updated_at) * 1000)
                       + c.delta),
           greatest(m.updated_at, %(now)s)
    FROM charge c JOIN meters m ON m.namespace = %(namespace)s AND m.key = c.key
    WHERE c.n = 1
    UNION ALL
    SELECT c.key, c.n, c.i,
           greatest(0, greatest(0, s.debt - greatest(0, %(now)s - s.updated_at) * 1000)
                       + c.delta),
           greatest(s.updated_at, %(now)s)
    FROM charged s JOIN charge c ON c.key = s.key AND c.n = s.n + 1
), saved AS (
    UPDATE meters SET debt = last.debt, updated_at = last.updated_at
    FROM (SELECT DISTINCT ON (key) key, debt, updated_at FROM charged ORDER BY key, n DESC) last
    WHERE meters.namespace = %(namespace)s AND meters.key = last.key
)
SELECT debt FROM charged ORDER BY i;

-- name: rate_slot_acquire
-- rate limits
-- shoal.ports.RateStore on PostgreSQL (shoal.stores.postgres_rate), with the semantics of the
-- memory reference (shoal.backends.memory.rates). Each operation is one transaction, its statements
-- sent in one pipeline (one round trip) as the coordination statements above are. The operations
-- on one slot key, or one window key, first take that key's advisory transaction lock
-- (advisory_xact_lock): a key may have no row to lock. Counter rows are created if missing and
-- locked in "C" order (rate_counter_keys_create, rate_counter_keys) before they are read. Times are
-- the app's clock, passed as parameters.
-- (This heading sits under the name line: text between blocks would end the block above.)
--
-- After the key's advisory lock. Slots that ended leave (the caller's own is overwritten instead
-- when it is granted: one statement never changes a row twice). The caller is granted a slot if
-- it holds a live one or fewer than max_slots are live; else it learns when the first one ends.
WITH live AS (
    SELECT holder, expires_at FROM rate_slots
    WHERE namespace = %(namespace)s AND key = %(key)s AND expires_at > %(now)s
), verdict AS (
    SELECT EXISTS (SELECT 1 FROM live WHERE holder = %(holder)s)
           OR (SELECT count(*) FROM live) < %(max_slots)s::bigint AS granted
), purged AS (
    DELETE FROM rate_slots USING verdict
    WHERE namespace = %(namespace)s AND key = %(key)s AND expires_at <= %(now)s
      AND (holder <> %(holder)s OR NOT verdict.granted)
), taken AS (
    INSERT INTO rate_slots (namespace, key, holder, expires_at)
    SELECT %(namespace)s::text, %(key)s::text, %(holder)s::text, %(until)s::double precision
    FROM verdict WHERE verdict.granted
    ON CONFLICT (namespace, key, holder) DO UPDATE SET expires_at = excluded.expires_at
)
SELECT verdict.granted, (SELECT min(expires_at) FROM live) AS retry_at FROM verdict;

-- name: rate_slot_renew
-- After the key's advisory lock: only a live slot is extended.
WITH renewed AS (
    UPDATE rate_slots SET expires_at = %(until)s
    WHERE namespace = %(namespace)s AND key = %(key)s AND holder = %(holder)s
      AND expires_at > %(now)s
    RETURNING holder
)
SELECT count(*) AS renewed FROM renewed;

-- name: rate_slot_release
-- After the key's advisory lock.
DELETE FROM rate_slots WHERE namespace = %(namespace)s AND key = %(key)s AND holder = %(holder)s;

-- name: rate_window_prune
-- After the key's advisory lock. Entries that left the window go (:cutoff is now - window), found
-- from the oldest through the index: the cost is the entries leaving, not the window. Their sum
-- is taken from the key's running total (rate_windows); with no entry left, the total is set to
-- exactly 0 (no drift survives an empty window). Nothing leaving: nothing written. (This
-- statement's snapshot still has the deleted rows: an entry is left if the newest is above the
-- cutoff, which max() reads from the end of the index.)
WITH gone AS (
    DELETE FROM rate_window_entries
    WHERE namespace = %(namespace)s AND key = %(key)s AND at <= %(cutoff)s
    RETURNING amount
)
UPDATE rate_windows w
SET total = CASE WHEN (SELECT max(at) FROM rate_window_entries
                       WHERE namespace = %(namespace)s AND key = %(key)s) > %(cutoff)s
                 THEN w.total - g.amount ELSE 0 END
FROM (SELECT sum(amount) AS amount FROM gone) g
WHERE w.namespace = %(namespace)s AND w.key = %(key)s AND g.amount IS NOT NULL;

-- name: rate_window_add
-- After rate_window_prune (every entry is in the window; the key's total is theirs, no row: 0).
-- A positive amount that would take the total above a limit is refused, and then, if it fits the
-- limit on its own, the answer says when: walking the entries oldest first (ties in the order
-- they were added, "seq"), the time of the first whose leaving, with those before it, leaves
-- room, plus the window. The walk reads the index in order and stops there (the running sum is
-- of the rows read so far, LIMIT 1). Else the amount is added, to the entries and to the total
-- (nothing for 0: a read).
WITH verdict AS (
    SELECT t.total,
           NOT (%(amount)s::double precision > 0 AND %(limit)s::double precision IS NOT NULL
                AND t.total + %(amount)s::double precision > %(limit)s::double precision)
               AS added
    FROM (SELECT coalesce(sum(total), 0)::double precision AS total FROM rate_windows
          WHERE namespace = %(namespace)s AND key = %(key)s) t
), added AS (
    INSERT INTO rate_window_entries (namespace, key, at, amount)
    SELECT %(namespace)s::text, %(key)s::text, %(now)s::double precision,
           %(amount)s::double precision
    FROM verdict WHERE verdict.added AND %(amount)s::double precision <> 0
), counted AS (
    INSERT INTO rate_windows AS w (namespace, key, total)
    SELECT %(namespace)s::text, %(key)s::text, verdict.total + %(amount)s::double precision
    FROM verdict WHERE verdict.added AND %(amount)s::double precision <> 0
    ON CONFLICT (namespace, key) DO UPDATE SET total = excluded.total
)
SELECT verdict.added, verdict.total,
       CASE WHEN NOT verdict.added
                 AND %(amount)s::double precision <= %(limit)s::double precision THEN (
           SELECT s.at + %(window)s::double precision FROM (
               SELECT at, seq, verdict.total - sum(amount) OVER (
                   ORDER BY at, seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS staying
               FROM rate_window_entries
               WHERE namespace = %(namespace)s AND key = %(key)s) s
           WHERE s.staying + %(amount)s::double precision <= %(limit)s::double precision
           ORDER BY s.at, s.seq
           LIMIT 1)
       END AS retry_at
FROM verdict;

-- name: rate_window_clear
-- After the key's advisory lock: the entries and their total.
WITH entries AS (
    DELETE FROM rate_window_entries WHERE namespace = %(namespace)s AND key = %(key)s
)
DELETE FROM rate_windows WHERE namespace = %(namespace)s AND key = %(key)s;

-- name: rate_pause_until
-- One upsert (it locks the key's row): a later pause in force is kept.
INSERT INTO rate_pauses AS p (namespace, key, until)
VALUES (%(namespace)s, %(key)s, %(until)s)
ON CONFLICT (namespace, key) DO UPDATE SET until = greatest(p.until, excluded.until)
RETURNING p.until;

-- name: rate_paused_until
SELECT until FROM rate_pauses
WHERE namespace = %(namespace)s AND key = %(key)s AND until > %(now)s;

-- name: read_rates
-- read_rates, one statement (one snapshot), reads only: per slot key its live holders, per window
-- (key, cutoff = now - window) the running total less the entries that left and are not deleted
-- yet (found from the oldest through the index; 0 when none stays), per pause key its end if in
-- force, per counter key its total (0: none).
SELECT 'slot' AS kind, k.key,
       (SELECT count(*) FROM rate_slots r
        WHERE r.namespace = %(namespace)s AND r.key = k.key
          AND r.expires_at > %(now)s)::double precision AS value
FROM unnest(%(slots)s::text[]) AS k (key)
UNION ALL
SELECT 'window', w.key,
       CASE WHEN g.amount IS NULL THEN coalesce(t.total, 0)
            WHEN EXISTS (SELECT 1 FROM rate_window_entries e
                         WHERE e.namespace = %(namespace)s AND e.key = w.key
                           AND e.at > w.cutoff) THEN coalesce(t.total, 0) - g.amount
            ELSE 0 END
FROM unnest(%(windows)s::text[], %(cutoffs)s::double precision[]) AS w (key, cutoff)
LEFT JOIN rate_windows t ON t.namespace = %(namespace)s AND t.key = w.key
CROSS JOIN LATERAL (SELECT sum(e.amount) AS amount FROM rate_window_entries e
                    WHERE e.namespace = %(namespace)s AND e.key = w.key
                      AND e.at <= w.cutoff) g
UNION ALL
SELECT 'pause', p.key,
       (SELECT r.until FROM rate_pauses r
        WHERE r.namespace = %(namespace)s AND r.key = p.key AND r.until > %(now)s)
FROM unnest(%(pauses)s::text[]) AS p (key)
UNION ALL
SELECT 'counter', c.key,
       coalesce((SELECT r.total FROM rate_counters r
                 WHERE r.namespace = %(namespace)s AND r.key = c.key), 0)
FROM unnest(%(counters)s::text[]) AS c (key);

-- name: rate_admit_generic_plan
-- Before rate_admit, for the rest of its transaction: the server's "auto" mode plans that prepared
-- statement afresh on every call (its generic plan, with arrays of unknown length, looks dearer),
-- and planning it costs more than running it (about 1 ms of 1.2 for an admission that only reads
-- a pause). Its generic plan reads every table through its primary key or the entries' index.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: rate_admit
-- After the advisory locks of every slot key (the circuit's trial slot among them) and every
-- window key of the request, taken in one order (slots then windows, each by key, as prune_rates
-- takes the window keys), then the circuit's counter rows (rate_counter_keys_create,
-- rate_counter_keys), and after rate_window_prune of each window (every entry is in its window).
-- A call's admission, all or nothing (shoal.ports.RateStore.admit): each need's verdict as
-- its own operation gives it (rate_slot_acquire, rate_paused_until, rate_window_add; the circuit:
-- its pause, then, while "opened" is above "closed", its trial slot of one place), the first need
-- refused by position (:*_pos, 0-based), and only with none refused the slots taken (the trial's
-- too) and the window amounts counted at :now. Pauses are read, never locked; the circuit's
-- counters, once looked at (no need before it refused, its pause not in force), are marked used
-- at :now whatever the answer, as counter_add's read marks them. Ended slots of
-- the keys leave either way (the caller's own, when it is taken, is overwritten instead: one
-- statement never changes a row twice). A refused window that fits its limit on its own says
-- when, walking its entries as rate_window_add does.
WITH slot AS (
    SELECT s.pos, s.key, s.max_slots, s.until,
           EXISTS (SELECT 1 FROM rate_slots r
                   WHERE r.namespace = %(namespace)s AND r.key = s.key
                     AND r.holder = %(holder)s AND r.expires_at > %(now)s)
           OR (SELECT count(*) FROM rate_slots r
               WHERE r.namespace = %(namespace)s AND r.key = s.key
                 AND r.expires_at > %(now)s) < s.max_slots AS granted,
           (SELECT min(r.expires_at) FROM rate_slots r
            WHERE r.namespace = %(namespace)s AND r.key = s.key
              AND r.expires_at > %(now)s) AS retry_at
    FROM unnest(%(slot_pos)s::int[], %(slot_keys)s::text[], %(slot_max)s::bigint[],
                %(slot_until)s::double precision[]) AS s(pos, key, max_slots, until)
), pause AS (
    SELECT p.pos, (SELECT r.until FROM rate_pauses r
                   WHERE r.namespace = %(namespace)s AND r.key = p.key
                     AND r.until > %(now)s) AS until
    FROM unnest(%(pause_pos)s::int[], %(pause_keys)s::text[]) AS p(pos, key)
), win AS (
    SELECT w.pos, w.key, w.amount, w.len, w.lim,
           coalesce((SELECT t.total FROM rate_windows t
                     WHERE t.namespace = %(namespace)s AND t.key = w.key), 0)::double precision
               AS total
    FROM unnest(%(win_pos)s::int[], %(win_keys)s::text[], %(win_amounts)s::double precision[],
                %(win_lengths)s::double precision[], %(win_limits)s::double precision[])
         AS w(pos, key, amount, len, lim)
), circuit AS (
    SELECT %(circuit_pos)s::int AS pos,
           (SELECT r.until FROM rate_pauses r
            WHERE r.namespace = %(namespace)s AND r.key = %(open)s
              AND r.until > %(now)s) AS open_until,
           coalesce((SELECT r.total FROM rate_counters r
                     WHERE r.namespace = %(namespace)s AND r.key = %(opened)s), 0) AS opened,
           coalesce((SELECT r.total FROM rate_counters r
                     WHERE r.namespace = %(namespace)s AND r.key = %(closed)s), 0) AS closed,
           EXISTS (SELECT 1 FROM rate_slots r
                   WHERE r.namespace = %(namespace)s AND r.key = %(trial)s
                     AND r.expires_at > %(now)s AND r.holder <> %(holder)s) AS trial_busy
    WHERE %(circuit_pos)s::int IS NOT NULL
), refusals (pos, retry_at) AS (
    SELECT pos, retry_at FROM slot WHERE NOT granted
    UNION ALL
    SELECT pos, until FROM pause WHERE until IS NOT NULL
    UNION ALL
    SELECT pos, NULL::double precision FROM win WHERE lim IS NOT NULL AND total + amount > lim
    UNION ALL
    SELECT pos, open_until FROM circuit
    WHERE open_until IS NOT NULL OR (opened > closed AND trial_busy)
), verdict AS (
    SELECT r.pos AS refused, r.retry_at
    FROM (SELECT NULL::int AS pos) nothing
    LEFT JOIN (SELECT pos, retry_at FROM refusals ORDER BY pos LIMIT 1) r ON true
), trial AS (
    SELECT c.opened FROM circuit c, verdict v WHERE v.refused IS NULL AND c.opened > c.closed
), taking (key, until) AS (
    SELECT s.key, s.until FROM slot s, verdict v WHERE v.refused IS NULL
    UNION ALL
    SELECT %(trial)s::text, %(trial_until)s::double precision FROM trial
), purged AS (
    DELETE FROM rate_slots r
    WHERE r.namespace = %(namespace)s AND r.key = ANY(%(slot_keys_all)s::text[])
      AND r.expires_at <= %(now)s
      AND NOT (r.holder = %(holder)s AND r.key IN (SELECT key FROM taking))
), taken AS (
    INSERT INTO rate_slots (namespace, key, holder, expires_at)
    SELECT %(namespace)s::text, t.key, %(holder)s::text, t.until FROM taking t
    ON CONFLICT (namespace, key, holder) DO UPDATE SET expires_at = excluded.expires_at
), added AS (
    INSERT INTO rate_window_entries (namespace, key, at, amount)
    SELECT %(namespace)s::text, w.key, %(now)s::double precision, w.amount
    FROM win w, verdict v WHERE v.refused IS NULL
    ORDER BY w.pos
), counted AS (
    INSERT INTO rate_windows AS t (namespace, key, total)
    SELECT %(namespace)s::text, w.key, w.total + w.amount FROM win w, verdict v
    WHERE v.refused IS NULL
    ON CONFLICT (namespace, key) DO UPDATE SET total = excluded.total
), used AS (
    UPDATE rate_counters SET updated_at = %(now)s
    WHERE namespace = %(namespace)s AND key IN (%(opened)s, %(closed)s)
      AND EXISTS (SELECT 1 FROM circuit c WHERE c.open_until IS NULL
                  AND NOT EXISTS (SELECT 1 FROM refusals r WHERE r.pos < c.pos))
)
SELECT v.refused,
       CASE WHEN w.pos IS NULL THEN v.retry_at
            WHEN w.amount <= w.lim THEN (
                SELECT s.at + w.len FROM (
                    SELECT e.at, e.seq, w.total - sum(e.amount) OVER (
                        ORDER BY e.at, e.seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                        AS staying
                    FROM rate_window_entries e
                    WHERE e.namespace = %(namespace)s AND e.key = w.key) s
                WHERE s.staying + w.amount <= w.lim
                ORDER BY s.at, s.seq
                LIMIT 1)
       END AS retry_at,
       (SELECT opened FROM trial) AS trial
FROM verdict v
LEFT JOIN win w ON w.pos = v.refused;

-- name: rate_counter_keys_create
-- The rows of counters never counted (total 0 as of now), in key order, as meter_keys_create.
-- A refused add leaves such a row at 0, which reads as the counter that was not there.
INSERT INTO rate_counters (namespace, key, total, updated_at)
SELECT %(namespace)s::text, d.k, 0, %(now)s::double precision
FROM (SELECT DISTINCT k FROM unnest(%(keys)s::text[]) AS k) d
ORDER BY d.k COLLATE "C"
-- An existing row is locked here already, as in meter_keys_create (prune_rates deletes counters).
ON CONFLICT (namespace, key) DO UPDATE SET total = rate_counters.total WHERE false;

-- name: rate_counter_keys
SELECT key FROM rate_counters
WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[])
ORDER BY key COLLATE "C"
FOR UPDATE;

-- name: rate_counter_add
-- After rate_counter_keys_create and rate_counter_keys. The amounts in request order, a key named
-- twice counted twice: each key's amounts are added in order (the recursion), as the memory
-- reference adds them. "over" is the first position whose positive amount takes its counter above
-- its limit; with none, each key's last total is stored (updated_at now) and the spend, if any,
-- goes to the ledger (after the ledger's advisory lock, when there is a spend: its id is taken
-- under the lock, which is held until the commit, so the namespace's rows commit in id order). One row per position: the counter after that position, and before the call.
WITH RECURSIVE step AS (
    SELECT c.key, c.amount, c.lim, c.i, row_number() OVER (PARTITION BY c.key ORDER BY c.i) AS n
    FROM unnest(%(keys)s::text[], %(amounts)s::double precision[],
                %(limits)s::double precision[]) WITH ORDINALITY AS c(key, amount, lim, i)
), counted (key, n, i, amount, lim, total) AS (
    SELECT s.key, s.n, s.i, s.amount, s.lim, r.total + s.amount
    FROM step s JOIN rate_counters r ON r.namespace = %(namespace)s AND r.key = s.key
    WHERE s.n = 1
    UNION ALL
    SELECT s.key, s.n, s.i, s.amount, s.lim, c.total + s.amount
    FROM counted c JOIN step s ON s.key = c.key AND s.n = c.n + 1
), verdict AS (
    SELECT (SELECT min(i) FROM counted WHERE amount > 0 AND lim IS NOT NULL AND total > lim)
        AS over
), saved AS (
    UPDATE rate_counters SET total = last.total, updated_at = %(now)s
    FROM (SELECT DISTINCT ON (key) key, total FROM counted ORDER BY key, n DESC) last, verdict
    WHERE verdict.over IS NULL AND rate_counters.namespace = %(namespace)s
      AND rate_counters.key = last.key
), logged AS (
    INSERT INTO cost_ledger (namespace, tenant, run_id, root_id, amount, currency, at, provider,
                             tokens)
    SELECT %(namespace)s::text, %(tenant)s::text, %(run_id)s::text, %(root_id)s::text,
           %(amount)s::double precision, %(currency)s::text, %(at)s::double precision,
           %(provider)s::text, %(tokens)s::bigint
    FROM verdict WHERE verdict.over IS NULL AND %(entry)s::boolean
)
SELECT c.i, c.total, r.total AS before, verdict.over
FROM counted c
JOIN rate_counters r ON r.namespace = %(namespace)s AND r.key = c.key
CROSS JOIN verdict
ORDER BY c.i;

-- name: cost_ledger
-- A page of the ledger (shoal.ports.RateStore.ledger): rows with id > :after in id order, the
-- walk of the namespace's rows through cost_ledger_namespace (migration 11) ending at :limit
-- matches. The other cost_ledger_of_* statements are the same, each walking the index of its
-- narrowest filter (a run, then a root, then a tenant) from :after; the other filters, and
-- :since/:until on at (the writer's clock, not in id order), are checked on the rows walked.
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens FROM cost_ledger
WHERE namespace = %(namespace)s AND id > %(after)s
  AND (%(since)s::double precision IS NULL OR at >= %(since)s)
  AND (%(until)s::double precision IS NULL OR at < %(until)s)
ORDER BY id
LIMIT %(limit)s;

-- name: cost_ledger_of_tenant
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens FROM cost_ledger
WHERE namespace = %(namespace)s AND tenant = %(tenant)s AND id > %(after)s
  AND (%(since)s::double precision IS NULL OR at >= %(since)s)
  AND (%(until)s::double precision IS NULL OR at < %(until)s)
ORDER BY id
LIMIT %(limit)s;

-- name: cost_ledger_of_root
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens FROM cost_ledger
WHERE namespace = %(namespace)s AND root_id = %(root_id)s AND id > %(after)s
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(since)s::double precision IS NULL OR at >= %(since)s)
  AND (%(until)s::double precision IS NULL OR at < %(until)s)
ORDER BY id
LIMIT %(limit)s;

-- name: cost_ledger_of_run
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens FROM cost_ledger
WHERE namespace = %(namespace)s AND run_id = %(run_id)s AND id > %(after)s
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(root_id)s::text IS NULL OR root_id = %(root_id)s)
  AND (%(since)s::double precision IS NULL OR at >= %(since)s)
  AND (%(until)s::double precision IS NULL OR at < %(until)s)
ORDER BY id
LIMIT %(limit)s;

-- name: prune_coordination
-- retention (prune_coordination, prune_rates): one statement each, deleting at most :limit rows
-- in all (each table gets what the ones before it left). Rows are locked FOR UPDATE SKIP LOCKED
-- before they go: a row an operation holds is left for a later batch, so a prune never waits
-- (and never deadlocks) with an operation; the condition is checked again on the locked row.
-- (This heading sits under the name line: text between blocks would end the block above.)
--
-- Meters fully drained by :before (a drained meter reads as a missing one: meter_keys_create
-- locks a row before meter reads it, so one that is being charged is skipped), then lock waiter
-- rows whose lease ended by :before (lock rows stay: they keep the fencing counters).
WITH drained AS (
    DELETE FROM meters m
    USING (SELECT key FROM meters
           WHERE namespace = %(namespace)s
             AND updated_at + debt / 1000 <= %(before)s::double precision
           LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) d
    WHERE m.namespace = %(namespace)s AND m.key = d.key
    RETURNING 1
), waiters AS (
    DELETE FROM lock_waiters w
    USING (SELECT key, holder FROM lock_waiters
           WHERE namespace = %(namespace)s AND expires_at <= %(before)s::double precision
           LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM drained))
           FOR UPDATE SKIP LOCKED) d
    WHERE w.namespace = %(namespace)s AND w.key = d.key AND w.holder = d.holder
    RETURNING 1
)
SELECT (SELECT count(*) FROM drained) + (SELECT count(*) FROM waiters) AS deleted;

-- name: prune_window_keys
-- Before prune_rates, outside its transaction: the window keys of the oldest :limit entries dated
-- at or before :before (through rate_window_entries_at), whose advisory locks prune_rates takes.
SELECT DISTINCT key FROM (
    SELECT key FROM rate_window_entries
    WHERE namespace = %(namespace)s AND at <= %(before)s::double precision
    ORDER BY at, seq
    LIMIT %(limit)s) e;

-- name: prune_rates
-- After the advisory locks of the window keys :keys (in key order). Ended slots, window entries of
-- those keys dated at or before :before (oldest first), ended pauses, then counters idle since
-- before :before; never the ledger. Each window whose entries go has their sum taken from its
-- running total, or its total row deleted when no entry is left (this statement's snapshot still
-- has the deleted entries: one is left if it is not among them). Counters are locked as the
-- others: rate_counter_keys_create locks a row before counter_add reads it.
WITH slots AS (
    DELETE FROM rate_slots s
    USING (SELECT key, holder FROM rate_slots
           WHERE namespace = %(namespace)s AND expires_at <= %(before)s::double precision
           LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) d
    WHERE s.namespace = %(namespace)s AND s.key = d.key AND s.holder = d.holder
    RETURNING 1
), gone AS (
    DELETE FROM rate_window_entries e
    USING (SELECT key, at, seq FROM rate_window_entries
           WHERE namespace = %(namespace)s AND key = ANY(%(keys)s::text[])
             AND at <= %(before)s::double precision
           ORDER BY at, seq
           LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM slots))) d
    WHERE e.namespace = %(namespace)s AND e.key = d.key AND e.at = d.at AND e.seq = d.seq
    RETURNING e.key, e.seq, e.amount
), sums AS (
    SELECT g.key, sum(g.amount) AS amount,
           EXISTS (SELECT 1 FROM rate_window_entries r
                   WHERE r.namespace = %(namespace)s AND r.key = g.key
                     AND r.seq NOT IN (SELECT seq FROM gone)) AS remains
    FROM gone g GROUP BY g.key
), totals AS (
    INSERT INTO rate_windows AS w (namespace, key, total)
    SELECT %(namespace)s::text, key, -amount FROM sums WHERE remains
    ON CONFLICT (namespace, key) DO UPDATE SET total = w.total + excluded.total
), emptied AS (
    DELETE FROM rate_windows
    WHERE namespace = %(namespace)s AND key IN (SELECT key FROM sums WHERE NOT remains)
), pauses AS (
    DELETE FROM rate_pauses p
    USING (SELECT key FROM rate_pauses
           WHERE namespace = %(namespace)s AND until <= %(before)s::double precision
           LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM slots)
                             - (SELECT count(*) FROM gone))
           FOR UPDATE SKIP LOCKED) d
    WHERE p.namespace = %(namespace)s AND p.key = d.key
    RETURNING 1
), idle AS (
    SELECT key, updated_at FROM rate_counters
    WHERE namespace = %(namespace)s AND updated_at < %(before)s::double precision
    ORDER BY updated_at, key
    LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM slots)
                      - (SELECT count(*) FROM gone) - (SELECT count(*) FROM pauses))
    FOR UPDATE SKIP LOCKED
), skipped AS (
    -- the first idle counter (in the order above) not locked here: one locked by a transaction
    -- in flight, or one past the limit. Only the counters before it go, so a batch never deletes
    -- a counter and keeps one before it (a circuit's '…-reclosed' without its '…-opened', while
    -- rate_counter_keys_create holds '…-opened' and is about to lock '…-reclosed')
    SELECT r.updated_at, r.key FROM rate_counters r
    WHERE r.namespace = %(namespace)s AND r.updated_at < %(before)s::double precision
      AND r.key NOT IN (SELECT key FROM idle)
    ORDER BY r.updated_at, r.key
    LIMIT 1
), counters AS (
    DELETE FROM rate_counters c
    USING idle d
    WHERE c.namespace = %(namespace)s AND c.key = d.key
      AND NOT EXISTS (SELECT 1 FROM skipped s WHERE (s.updated_at, s.key) < (d.updated_at, d.key))
    RETURNING 1
)
SELECT (SELECT count(*) FROM slots) + (SELECT count(*) FROM gone)
       + (SELECT count(*) FROM pauses) + (SELECT count(*) FROM counters) AS deleted;

-- the console's reads (shoal.ports.RunInspection) -------------------------------------------
-- search_runs is built in store.py from the filters given.

-- name: inspect_steps
SELECT seq, name, output, finished, epoch, finished_at, started_at, attempt, retries FROM steps
WHERE run_id = %(run_id)s ORDER BY seq;

-- name: inspect_signals
SELECT id, name, payload, created_at, consumed FROM signals
WHERE run_id = %(run_id)s ORDER BY created_at, id;

-- name: inspect_pauses
SELECT * FROM pauses WHERE run_id = %(run_id)s ORDER BY created_at, id;

-- name: inspect_outbox
SELECT * FROM outbox WHERE run_id = %(run_id)s ORDER BY seq, idx;

-- name: inspect_children
SELECT * FROM runs WHERE root_id = %(root_id)s AND id <> root_id ORDER BY id LIMIT %(limit)s;

-- Runs ended per minute, from the retention index alone (an index-only scan: the status term
-- is its WHERE), so the cost is the runs that ended in the span.
-- name: run_owners
-- The owners of running runs, through runs_claimed (its cost: the running runs).
SELECT owner, count(*) AS running, max(lease_expires_at) AS lease_until
FROM runs
WHERE namespace = %(namespace)s AND status IN ('running', 'interrupted') AND status = 'running'
  AND owner IS NOT NULL
GROUP BY owner
ORDER BY owner COLLATE "C"
LIMIT %(limit)s;

-- name: finished_per_minute
SELECT floor((finished_at - %(since)s) / 60)::int AS minute, count(*) AS n
FROM runs
WHERE namespace = %(namespace)s AND status IN ('succeeded', 'failed', 'cancelled')
  AND finished_at >= %(since)s AND finished_at < %(until)s
GROUP BY 1;

-- name: redrive
UPDATE outbox SET dead = false, attempts = 0, next_at = %(now)s
WHERE id = %(id)s AND namespace = %(namespace)s AND dead
RETURNING *;

-- name: get_outbox
SELECT * FROM outbox WHERE id = %(id)s AND namespace = %(namespace)s;

-- name: held_running
-- The runs in running per (workflow, tenant) of the workflows given: what max_running and
-- max_running_per_tenant count, read by the index of claimed runs (runs_claimed).
SELECT workflow, tenant, count(*) AS n FROM runs
WHERE namespace = %(namespace)s AND status = 'running' AND workflow = ANY(%(workflows)s::text[])
GROUP BY workflow, tenant;

-- name: held_first_starts
-- A workflow's runs of one rate key first started (started_at) after since, up to limit: the
-- claim's count of a rate window, walking runs_rate_starts.
SELECT count(*) AS n FROM (
    SELECT 1 FROM runs
    WHERE namespace = %(namespace)s AND workflow = %(workflow)s
      AND rate_key IS NOT NULL AND rate_key = coalesce(%(rate_key)s::text, '')
      AND started_at IS NOT NULL AND started_at > %(since)s
    LIMIT %(limit)s) s;

-- name: held_rate_key
SELECT rate_key FROM runs WHERE id = %(id)s AND namespace = %(namespace)s;

-- name: held_count_due
-- A workflow's due queued runs, up to cap, walking runs_queued: of tenants only (NULL: every
-- tenant), none of skip; with first_only, never started; with key_limit, never started and of a
-- key with at least key_limit holders (one probe of runs_key_holder each); with rate_limit, see
-- below.
SELECT count(*) AS n FROM (
    SELECT 1 FROM runs r
    WHERE r.namespace = %(namespace)s AND r.status = 'queued' AND NOT r.held
      AND r.workflow = %(workflow)s AND r.run_at <= %(now)s
      AND (%(tenants)s::text[] IS NULL OR r.tenant = ANY(%(tenants)s::text[]))
      AND NOT r.tenant = ANY(%(skip)s::text[])
      AND (NOT %(first_only)s OR r.started_at IS NULL)
      AND (%(key_limit)s::int IS NULL OR (r.concurrency_key IS NOT NULL AND (
          SELECT count(*) FROM runs h
          WHERE h.namespace = r.namespace AND h.workflow = r.workflow
            AND h.concurrency_key = r.concurrency_key AND h.started_at IS NOT NULL
            AND h.status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
      ) >= %(key_limit)s::int))
      -- with rate_limit: never started, of a window (its rate key's first starts after
      -- rate_since) full or not (rate_full), walking runs_rate_starts
      AND (%(rate_limit)s::int IS NULL OR (r.started_at IS NULL AND ((
          SELECT count(*) FROM (
              SELECT 1 FROM runs o
              WHERE o.namespace = r.namespace AND o.workflow = r.workflow
                AND o.rate_key IS NOT NULL AND o.rate_key = coalesce(r.rate_key, '')
                AND o.started_at IS NOT NULL AND o.started_at > %(rate_since)s
              LIMIT %(rate_limit)s) s) >= %(rate_limit)s::int) = %(rate_full)s))
    LIMIT %(cap)s) q;

-- name: held_key_holders
SELECT count(*) AS n FROM (
    SELECT 1 FROM runs
    WHERE namespace = %(namespace)s AND workflow = %(workflow)s AND concurrency_key = %(key)s
      AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
    LIMIT %(cap)s) k;
