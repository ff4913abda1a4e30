-- Named statements of the SQLite store. Each block starts with "-- name: NAME".

-- name: incompatible_runs
-- Started runs that are due but were started by another code version (recovery leaves them).
SELECT * FROM (
    SELECT * FROM runs INDEXED BY runs_queued
    WHERE namespace = :namespace AND status = 'queued' AND held = 0 AND run_at <= :now
      AND started_at IS NOT NULL
    UNION ALL
    SELECT * FROM runs INDEXED BY runs_timed
    WHERE namespace = :namespace AND status IN ('sleeping', 'waiting') AND run_at <= :now
)
WHERE version IS NOT :version
  AND workflow IN (SELECT value FROM json_each(:workflows))
  AND workflow NOT IN (SELECT value FROM json_each(:any_version))
LIMIT :limit;

-- name: insert_run
INSERT INTO runs (id, namespace, tenant, workflow, input, status, priority, created_at, run_at,
                  max_attempts, concurrency_key, idempotency_key, version, parent_id, root_id, held,
                  trace_context, rate_key)
VALUES (:id, :namespace, :tenant, :workflow, :input, 'queued', :priority, :created_at, :run_at,
        :max_attempts, :concurrency_key, :idempotency_key, :version, :parent_id, :root_id, :held,
        :trace_context, :rate_key)
RETURNING *;

-- name: insert_runs
-- create_runs: one row per item (executemany), in the batch's transaction.
INSERT INTO runs (id, namespace, tenant, workflow, input, status, priority, created_at, run_at,
                  max_attempts, concurrency_key, idempotency_key, version, parent_id, root_id, held,
                  trace_context, rate_key)
VALUES (:id, :namespace, :tenant, :workflow, :input, 'queued', :priority, :created_at, :run_at,
        :max_attempts, :concurrency_key, :idempotency_key, :version, :parent_id, :root_id, :held,
        :trace_context, :rate_key);

-- name: find_idempotent
SELECT * FROM runs
WHERE namespace = :namespace AND tenant = :tenant AND workflow = :workflow
  AND idempotency_key = :idempotency_key;

-- name: count_queued
SELECT
    (SELECT count(*) FROM runs INDEXED BY runs_queued
     WHERE namespace = :namespace AND status = 'queued' AND held = 0 AND started_at IS NULL),
    (SELECT count(*) FROM runs INDEXED BY runs_held WHERE namespace = :namespace AND held = 1);

-- name: get_run
SELECT * FROM runs WHERE id = :id;

-- name: claim_candidates
-- Due runs in claim order whose concurrency key no started, unfinished run of the key holds
-- (started_at: a run that started before holds its key itself).
-- Two branches, each limited and walking its partial index, so the cost stays flat however
-- many runs are finished or queued behind: queued in claim order, due sleepers and waiters.
-- A run of a paused workflow (paused_workflows) is no candidate: one probe of its primary key.
SELECT id, workflow, concurrency_key, started_at FROM (
    SELECT * FROM (
        SELECT r.id, r.workflow, r.concurrency_key, r.priority, r.created_at, r.started_at
        FROM runs r INDEXED BY runs_queued
        WHERE r.namespace = :namespace AND r.status = 'queued' AND r.held = 0
          AND r.run_at <= :now AND r.workflow IN (SELECT value FROM json_each(:workflows))
          AND (r.started_at IS NULL OR r.version IS :version
               OR r.workflow IN (SELECT value FROM json_each(:any_version)))
          AND (r.concurrency_key IS NULL OR r.started_at IS NOT NULL OR NOT EXISTS (
                SELECT 1 FROM runs o INDEXED BY runs_key_holder
                WHERE o.namespace = r.namespace AND o.workflow = r.workflow
                  AND o.concurrency_key = r.concurrency_key
                  AND o.concurrency_key IS NOT NULL AND o.started_at IS NOT NULL
                  AND o.status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')))
          AND NOT EXISTS (SELECT 1 FROM paused_workflows p WHERE p.namespace = r.namespace
                          AND p.workflow = r.workflow AND p.tenant IN ('', r.tenant))
        ORDER BY r.priority DESC, r.created_at, r.id
        LIMIT :scan)
    UNION ALL
    SELECT * FROM (
        SELECT r.id, r.workflow, r.concurrency_key, r.priority, r.created_at, r.started_at
        FROM runs r INDEXED BY runs_timed
        WHERE r.namespace = :namespace AND r.status IN ('sleeping', 'waiting')
          AND r.run_at <= :now AND r.workflow IN (SELECT value FROM json_each(:workflows))
          AND (r.version IS :version
               OR r.workflow IN (SELECT value FROM json_each(:any_version)))
          AND NOT EXISTS (SELECT 1 FROM paused_workflows p WHERE p.namespace = r.namespace
                          AND p.workflow = r.workflow AND p.tenant IN ('', r.tenant))
        ORDER BY r.priority DESC, r.created_at, r.id
        LIMIT :scan)
)
ORDER BY priority DESC, created_at, id
LIMIT :scan;

-- name: key_slots
-- The slots of a key its holders take (a workflow with a concurrency_limit above 1): the claim
-- gives a run the smallest one free.
SELECT key_slot FROM runs INDEXED BY runs_key_holder
WHERE namespace = :namespace AND workflow = :workflow AND concurrency_key = :key
  AND concurrency_key IS NOT NULL AND started_at IS NOT NULL
  AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted');

-- name: take_key_slot
UPDATE runs SET key_slot = :slot WHERE id = :id AND started_at IS NULL;

-- name: claim
UPDATE runs
SET status = 'running', owner = :owner, lease_expires_at = :expires, lease_epoch = lease_epoch + 1,
    attempts = max(attempts, 1), started_at = coalesce(started_at, :now), wait_for = NULL,
    run_at = :now,
    -- a run takes the version of the code that first executes it
    version = CASE WHEN started_at IS NULL THEN :version ELSE version END,
    resume_reason = CASE WHEN status = 'sleeping' THEN 'woke'
                         WHEN status = 'waiting' THEN 'resumed'
                         -- retried (retry_run) or dispatched: never started before
                         WHEN started_at IS NULL THEN coalesce(resume_reason, 'dispatched')
                         ELSE coalesce(resume_reason, 'recovered') END
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING *;

-- name: renew
UPDATE runs SET lease_expires_at = :expires
WHERE id = :id AND owner = :owner AND lease_epoch = :epoch AND status = 'running'
RETURNING id, cancel_requested;

-- name: load_steps
SELECT seq, name, output, finished, epoch, started_at, attempt, retries FROM steps
WHERE run_id = :run_id ORDER BY seq;

-- name: fence_extend
UPDATE runs SET lease_expires_at = :expires
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: fence_check
SELECT 1 FROM runs
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: put_step
INSERT INTO steps (run_id, seq, name, output, finished, epoch, finished_at, started_at, attempt,
                   retries)
VALUES (:run_id, :seq, :name, :output, :finished, :epoch, :finished_at, :started_at, :attempt,
        :retries)
ON CONFLICT (run_id, seq) DO UPDATE
SET name = excluded.name, output = excluded.output, finished = excluded.finished,
    epoch = excluded.epoch, finished_at = excluded.finished_at,
    started_at = excluded.started_at, attempt = excluded.attempt, retries = excluded.retries
WHERE steps.finished = 0;

-- name: record_progress
UPDATE runs SET progress = :progress, progress_at = :progress_at
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: suspend
UPDATE runs
SET status = :status, run_at = :run_at, wait_for = :wait_for, owner = NULL, lease_expires_at = NULL
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: next_signal
SELECT id, payload FROM signals
WHERE run_id = :run_id AND name = :name AND consumed = 0
ORDER BY created_at, id LIMIT 1;

-- name: consume_signal
UPDATE signals SET consumed = 1 WHERE id = :id AND consumed = 0;

-- name: settle
UPDATE runs
SET status = :status, output = :output, error = :error, traceback = :traceback,
    finished_at = :finished_at, run_at = :run_at, attempts = attempts + :attempt_inc,
    owner = NULL, lease_expires_at = NULL,
    resume_reason = CASE WHEN :status = 'queued' THEN 'dispatched' ELSE resume_reason END
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: release
UPDATE runs SET status = 'interrupted', owner = NULL, lease_expires_at = NULL
WHERE id = :run_id AND owner = :owner AND lease_epoch = :epoch AND status = 'running';

-- name: anything_to_recover
SELECT 1 FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted')
  AND (status = 'interrupted' OR lease_expires_at <= :now)
LIMIT 1;

-- name: recover_crashed_final
UPDATE runs INDEXED BY runs_claimed
SET status = 'failed', finished_at = :now, owner = NULL, lease_expires_at = NULL,
    traceback = NULL,
    error = 'the instance executing attempt ' || attempts || ' of ' || max_attempts
            || ' stopped (crashed or lost its lease); no attempts are left'
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND lease_expires_at <= :now AND attempts >= max_attempts
RETURNING *;

-- name: recover_crashed
UPDATE runs INDEXED BY runs_claimed
SET status = 'queued', attempts = attempts + 1, owner = NULL, lease_expires_at = NULL, run_at = :now,
    resume_reason = 'recovered'
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND lease_expires_at <= :now
RETURNING *;

-- name: recover_cancelled_interrupted
UPDATE runs INDEXED BY runs_claimed SET status = 'cancelled', finished_at = :now
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'interrupted'
  AND cancel_requested = 1
RETURNING *;

-- name: recover_interrupted
UPDATE runs INDEXED BY runs_claimed SET status = 'queued', run_at = :now, resume_reason = 'recovered'
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'interrupted'
RETURNING *;

-- name: cancel_now
UPDATE runs
SET status = 'cancelled', cancel_requested = 1, finished_at = :now, held = 0, owner = NULL,
    lease_expires_at = NULL
WHERE id = :id AND status IN ('queued', 'sleeping', 'waiting', 'interrupted')
RETURNING *;

-- name: cancel_request
UPDATE runs SET cancel_requested = 1 WHERE id = :id AND status = 'running' RETURNING *;

-- name: retry_drop_unfinished
-- A sleep, wait, approval or child wait the run was in when it ended starts over.
DELETE FROM steps WHERE run_id = :id AND finished = 0;

-- name: retry
-- Queued again and not started: the claim takes its concurrency key and version as a new run's.
UPDATE runs
SET status = 'queued', attempts = 0, run_at = :now, started_at = NULL, finished_at = NULL,
    output = NULL, owner = NULL, lease_expires_at = NULL, wait_for = NULL, cancel_requested = 0,
    held = 0, resume_reason = 'retried'
WHERE id = :id AND status IN ('failed', 'cancelled')
RETURNING *;

-- name: uncount_retried
-- The run retry made live again leaves the counts of final runs (its status and end before the
-- retry); no trigger does it (see schema.sql).
INSERT INTO run_counts (namespace, workflow, status, bucket, n)
VALUES (:namespace, :workflow, :status,
        CAST(:finished_at AS INTEGER) - (:finished_at < CAST(:finished_at AS INTEGER)), -1);

-- name: insert_signal
INSERT INTO signals (id, run_id, name, payload, created_at)
VALUES (:id, :run_id, :name, :payload, :now);

-- name: wake_waiter
UPDATE runs SET run_at = :now
WHERE id = :run_id AND status = 'waiting' AND wait_for = :name
RETURNING *;

-- name: release_held
UPDATE runs SET held = 0
WHERE id IN (SELECT id FROM runs INDEXED BY runs_held WHERE namespace = :namespace AND held = 1
             ORDER BY created_at, id LIMIT :n);

-- name: prunable
SELECT id FROM runs INDEXED BY runs_finished
WHERE namespace = :namespace AND status IN ('succeeded', 'failed', 'cancelled')
  AND finished_at < :before
  -- a run whose outbox entries are still being delivered stays until they are done
  AND NOT EXISTS (SELECT 1 FROM outbox o
                  WHERE o.run_id = runs.id AND o.delivered_at IS NULL AND o.dead = 0)
ORDER BY finished_at, id
LIMIT :limit;

-- name: prune_steps
DELETE FROM steps WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_signals
DELETE FROM signals WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_runs
DELETE FROM runs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: stats
-- One statement, one snapshot. Live runs are counted from their rows, each branch one walk of a
-- partial index (INDEXED BY), so the cost follows the live runs, never the final ones; each
-- branch groups its own rows (SQLite groups by sorting: one sort of every live run, through a
-- union, took twice as long). Final runs from the run_counts rows of the namespace (a few per
-- workflow and status once folded). Due: queued (not held) or sleeping/waiting with run_at <=
-- now; oldest_due is the earliest run_at of a due run. A part with nothing in it has no row
-- (pauses, outbox, dead: always one).
SELECT 'live' AS part, 'queued' AS status, workflow, tenant, 0 AS held, count(*) AS n,
       count(*) FILTER (WHERE run_at <= :now) AS due,
       min(run_at) FILTER (WHERE run_at <= :now) AS oldest_due
FROM runs INDEXED BY runs_queued
WHERE namespace = :namespace AND status = 'queued' AND held = 0
GROUP BY workflow, tenant
UNION ALL
SELECT 'live', status, workflow, tenant, 1, count(*), 0, NULL FROM runs INDEXED BY runs_held
WHERE namespace = :namespace AND held = 1
GROUP BY status, workflow, tenant
UNION ALL
SELECT 'live', status, workflow, tenant, 0, count(*), count(*) FILTER (WHERE run_at <= :now),
       min(run_at) FILTER (WHERE run_at <= :now)
FROM runs INDEXED BY runs_timed
WHERE namespace = :namespace AND status IN ('sleeping', 'waiting') AND held = 0
GROUP BY status, workflow, tenant
UNION ALL
SELECT 'live', status, workflow, tenant, 0, count(*), 0, NULL FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND held = 0
GROUP BY status, workflow, tenant
UNION ALL
SELECT 'final', status, workflow, NULL, 0, sum(n),
       coalesce(sum(n) FILTER (WHERE bucket >= :since), 0), NULL
FROM run_counts
WHERE namespace = :namespace
GROUP BY status, workflow
UNION ALL
SELECT 'pauses', NULL, NULL, NULL, 0, count(*), 0, NULL FROM pauses INDEXED BY pauses_pending
WHERE namespace = :namespace AND status = 'pending'
UNION ALL
SELECT 'outbox', NULL, NULL, NULL, 0, count(*), 0, NULL FROM outbox INDEXED BY outbox_due
WHERE namespace = :namespace AND delivered_at IS NULL AND dead = 0
UNION ALL
SELECT 'dead', NULL, NULL, NULL, 0, count(*), 0, NULL FROM outbox INDEXED BY outbox_dead
WHERE namespace = :namespace AND dead = 1;

-- name: fold_sums
-- The namespace's run_counts summed: per (workflow, status, second) from :keep on, per
-- (workflow, status) before (bucket NULL); with ``todo`` when fold_stats has something to do
-- there (several rows, a second before :keep not folded yet, or a sum of 0).
SELECT workflow, status, CASE WHEN bucket >= :keep THEN bucket END AS folded, sum(n) AS n,
       count(*) > 1 OR min(bucket) < :keep OR sum(n) = 0 AS todo
FROM run_counts
WHERE namespace = :namespace
GROUP BY workflow, status, folded;

-- name: fold_delete
DELETE FROM run_counts WHERE namespace = :namespace;

-- name: fold_insert
INSERT INTO run_counts (namespace, workflow, status, bucket, n)
VALUES (:namespace, :workflow, :status, :folded, :n);

-- name: register_workflow
INSERT INTO workflows (namespace, name, options, registered_at)
VALUES (:namespace, :name, :options, :now)
ON CONFLICT (namespace, name) DO UPDATE
SET options = excluded.options, registered_at = excluded.registered_at;

-- name: get_workflow
SELECT options FROM workflows WHERE namespace = :namespace AND name = :name;

-- name: register_workflow_instance
INSERT INTO workflow_instances (namespace, workflow, instance, registered_at)
VALUES (:namespace, :name, :instance, :now)
ON CONFLICT (namespace, workflow, instance) DO UPDATE SET registered_at = excluded.registered_at;

-- name: forget_workflow_instances
DELETE FROM workflow_instances WHERE namespace = :namespace AND registered_at < :before;

-- name: list_workflows
SELECT namespace, name, options, registered_at FROM workflows
WHERE :namespace IS NULL OR namespace = :namespace
ORDER BY namespace, name;

-- name: list_workflow_instances
SELECT namespace, workflow, instance, registered_at FROM workflow_instances
WHERE :namespace IS NULL OR namespace = :namespace
ORDER BY namespace, workflow, registered_at DESC, instance;

-- name: pause_workflow
INSERT INTO paused_workflows (namespace, workflow, tenant, paused_at)
VALUES (:namespace, :workflow, :tenant, :now)
ON CONFLICT (namespace, workflow, tenant) DO NOTHING;

-- name: resume_workflow
DELETE FROM paused_workflows
WHERE namespace = :namespace AND workflow = :workflow AND tenant = :tenant;

-- name: set_tenant_weight
INSERT INTO tenant_weights (namespace, tenant, weight) VALUES (:namespace, :tenant, :weight)
ON CONFLICT (namespace, tenant) DO UPDATE SET weight = excluded.weight;

-- name: clear_tenant_weight
-- 1 is the default: no row
DELETE FROM tenant_weights WHERE namespace = :namespace AND tenant = :tenant;

-- name: tenant_weights
SELECT tenant, weight FROM tenant_weights WHERE namespace = :namespace ORDER BY tenant;

-- name: paused_workflows
SELECT workflow, tenant, paused_at FROM paused_workflows WHERE namespace = :namespace
ORDER BY workflow, tenant;

-- name: insert_pause
INSERT INTO pauses (id, namespace, tenant, run_id, name, request, status, created_at, expires_at)
VALUES (:id, :namespace, :tenant, :run_id, :name, :request, 'pending', :created_at, :expires_at);

-- name: get_pause
SELECT * FROM pauses WHERE id = :id;

-- name: resolve_pause
UPDATE pauses SET status = 'resolved', decision = :decision, resolved_at = :now
WHERE id = :id AND status = 'pending'
RETURNING *;

-- name: wake_paused
UPDATE runs SET run_at = :now
WHERE id = :run_id AND status = 'waiting' AND wait_for = :wait_for;

-- name: list_pauses
SELECT * FROM pauses INDEXED BY pauses_pending
WHERE namespace = :namespace AND status = 'pending' AND (:tenant IS NULL OR tenant = :tenant)
ORDER BY created_at, id
LIMIT :limit;

-- name: expiring_pauses
SELECT id FROM pauses INDEXED BY pauses_expiring
WHERE namespace = :namespace AND status = 'pending' AND expires_at <= :now
ORDER BY expires_at, id;

-- name: notification_candidates
SELECT id FROM pauses INDEXED BY pauses_unnotified
WHERE namespace = :namespace AND notified = 0 AND (notify_until IS NULL OR notify_until <= :now)
ORDER BY created_at, id
LIMIT :limit;

-- name: take_notification
UPDATE pauses SET notify_until = :until
WHERE id = :id AND notified = 0 AND (notify_until IS NULL OR notify_until <= :now)
RETURNING *;

-- name: mark_notified
UPDATE pauses SET notified = 1, notify_until = NULL WHERE id = :id;

-- name: cancel_pauses_of_run
UPDATE pauses SET status = 'resolved', resolved_at = :now,
    decision = '{"approved":false,"data":null,"by":null,"reason":"cancelled"}'
WHERE run_id = :run_id AND status = 'pending';

-- name: any_pause_to_prune
SELECT 1 FROM pauses INDEXED BY pauses_resolved
WHERE namespace = :namespace AND status = 'resolved' AND resolved_at < :before
LIMIT 1;

-- name: prune_pauses
DELETE FROM pauses WHERE id IN (
    SELECT id FROM pauses INDEXED BY pauses_resolved
    WHERE namespace = :namespace AND status = 'resolved' AND resolved_at < :before
    ORDER BY resolved_at, id
    LIMIT :limit);

-- name: insert_tree_key
-- Only while the root is unfinished: its end removes the tree's keys, none may come after.
-- The key carries the root's tenant, read from the root's row by this same statement.
INSERT INTO tree_keys (root_id, key, value, claimant, created_at, tenant)
SELECT :root_id, :key, :value, :claimant, :now, tenant FROM runs
WHERE id = :root_id AND status NOT IN ('succeeded', 'failed', 'cancelled')
ON CONFLICT (root_id, key) DO NOTHING;

-- name: get_tree_key
SELECT value, claimant FROM tree_keys WHERE root_id = :root_id AND key = :key;

-- name: list_tree_keys
SELECT key, tenant FROM tree_keys WHERE root_id = :root_id ORDER BY key;

-- name: cancel_tree_now
UPDATE runs
SET status = 'cancelled', cancel_requested = 1, finished_at = :now, held = 0, owner = NULL,
    lease_expires_at = NULL
WHERE root_id = :id AND id <> :id AND status IN ('queued', 'sleeping', 'waiting', 'interrupted')
RETURNING id;

-- name: cancel_tree_request
UPDATE runs SET cancel_requested = 1 WHERE root_id = :id AND id <> :id AND status = 'running';

-- name: insert_outbox
INSERT INTO outbox (id, namespace, run_id, seq, idx, topic, payload, created_at, next_at,
                    trace_context)
VALUES (:id, :namespace, :run_id, :seq, :idx, :topic, :payload, :created_at, :now,
        :trace_context)
ON CONFLICT (run_id, seq, idx) DO NOTHING;

-- name: step_finished
SELECT finished FROM steps WHERE run_id = :run_id AND seq = :seq;

-- name: outbox_candidates
SELECT id FROM outbox INDEXED BY outbox_due
WHERE namespace = :namespace AND delivered_at IS NULL AND dead = 0 AND next_at <= :now
  AND topic IN (SELECT value FROM json_each(:topics))
ORDER BY next_at, created_at, id
LIMIT :limit;

-- name: take_outbox
UPDATE outbox SET next_at = :until
WHERE id = :id AND delivered_at IS NULL AND dead = 0 AND next_at <= :now
RETURNING *;

-- name: outbox_delivered
UPDATE outbox SET delivered_at = :now, error = NULL
WHERE id = :id AND delivered_at IS NULL AND dead = 0;

-- name: outbox_failed
UPDATE outbox
SET attempts = attempts + 1, error = :error, dead = :dead, next_at = :next_at
WHERE id = :id AND delivered_at IS NULL AND dead = 0;

-- name: dead_letters
SELECT * FROM outbox INDEXED BY outbox_dead
WHERE namespace = :namespace AND dead = 1
ORDER BY created_at, id
LIMIT :limit;

-- name: prune_outbox
DELETE FROM outbox WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: lock_purge_waiters
-- coordination (shoal.ports): locks, membership, meters; :keys is a JSON array of keys.
-- (This heading sits under the name line: text between blocks would end the block above.)
--
-- Waiters of these keys whose lease ended leave the queue.
DELETE FROM lock_waiters
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))
  AND expires_at <= :now;

-- name: lock_state
-- The caller's ticket (its waiter row on the first key), whether any key has a live holder,
-- whether someone is ahead of the caller in the queue of any key (the smallest live ticket of a
-- key is not the caller's; with no ticket, any waiter is ahead), and the largest token so far.
WITH mine (ticket) AS (
    SELECT (SELECT ticket FROM lock_waiters
            WHERE namespace = :namespace AND key = :first AND holder = :holder))
SELECT
    mine.ticket AS ticket,
    EXISTS (SELECT 1 FROM locks
            WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))
              AND holder IS NOT NULL AND expires_at > :now) AS taken,
    EXISTS (SELECT 1 FROM json_each(:keys) AS wanted
            WHERE coalesce((SELECT min(q.ticket) FROM lock_waiters AS q
                            WHERE q.namespace = :namespace AND q.key = wanted.value),
                           mine.ticket) IS NOT mine.ticket) AS behind,
    (SELECT coalesce(max(token), 0) FROM locks
     WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))) AS token
FROM mine;

-- name: lock_grant
INSERT INTO locks (namespace, key, holder, token, expires_at)
SELECT :namespace, value, :holder, :token, :expires_at FROM json_each(:keys) WHERE true
ON CONFLICT (namespace, key) DO UPDATE
SET holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at;

-- name: lock_unqueue
DELETE FROM lock_waiters
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))
  AND holder = :holder;

-- name: lock_next_ticket
INSERT INTO lock_tickets (namespace, ticket) VALUES (:namespace, 1)
ON CONFLICT (namespace) DO UPDATE SET ticket = ticket + 1
RETURNING ticket;

-- name: lock_enqueue
INSERT INTO lock_waiters (namespace, key, holder, ticket, expires_at)
SELECT :namespace, value, :holder, :ticket, :expires_at FROM json_each(:keys) WHERE true
ON CONFLICT (namespace, key, holder) DO UPDATE
SET ticket = excluded.ticket, expires_at = excluded.expires_at;

-- name: lock_retry_at
-- When the caller is to ask again by itself: the earliest, among its keys, of the lease end of the
-- live holder and of the live waiter right ahead of it (largest smaller ticket), if any. (Waiters
-- were purged first: every row left is live. The holder's end counts for every waiter, so a dead
-- holder is noticed when its lease ends even if the waiters ahead give up: a release names nobody
-- while the holder's row is there.)
SELECT min(ends) FROM (
    SELECT (SELECT q.expires_at FROM lock_waiters AS q
            WHERE q.namespace = :namespace AND q.key = wanted.value AND q.ticket < :ticket
            ORDER BY q.ticket DESC LIMIT 1) AS ends
    FROM json_each(:keys) AS wanted
    UNION ALL
    SELECT l.expires_at FROM locks AS l
    WHERE l.namespace = :namespace AND l.key IN (SELECT value FROM json_each(:keys))
      AND l.holder IS NOT NULL AND l.expires_at > :now);

-- name: lock_held
SELECT count(*) FROM locks
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))
  AND holder = :holder AND expires_at > :now;

-- name: lock_renew
UPDATE locks SET expires_at = :expires_at
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))
  AND holder = :holder;

-- name: lock_release_heads
-- Before lock_release and lock_unqueue: whom the release is to wake. On each key where the caller
-- holds the lock (even with an ended lease) or is the first waiter, and that no one else holds,
-- the first waiter but the caller (smallest ticket; a row whose lease ended counts).
SELECT DISTINCT
    (SELECT q.holder FROM lock_waiters AS q
     WHERE q.namespace = :namespace AND q.key = wanted.value AND q.holder <> :holder
     ORDER BY q.ticket LIMIT 1) AS head
FROM json_each(:keys) AS wanted
LEFT JOIN locks AS l ON l.namespace = :namespace AND l.key = wanted.value
WHERE (l.holder IS NULL OR l.holder = :holder)
  AND (l.holder = :holder
       OR (SELECT q.holder FROM lock_waiters AS q
           WHERE q.namespace = :namespace AND q.key = wanted.value
           ORDER BY q.ticket LIMIT 1) = :holder);

-- name: lock_release
-- The row stays: it keeps the key's fencing counter.
UPDATE locks SET holder = NULL, expires_at = 0
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys))
  AND holder = :holder;

-- name: lock_watch_state
-- For the lock watches of another connection's commits, per watched [namespace, key, holder]:
-- the holder's ticket on the key (NULL: not queued there), whether it is the first waiter there
-- (smallest ticket, a row whose lease ended counting), and whether the key has no holder (one
-- whose lease ended still counts: the first waiter's retry_at is its end).
WITH watched (namespace, key, holder) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]')
    FROM json_each(:watched))
SELECT w.namespace, w.key, w.holder,
       (SELECT q.ticket FROM lock_waiters AS q
        WHERE q.namespace = w.namespace AND q.key = w.key AND q.holder = w.holder) AS ticket,
       coalesce((SELECT q.holder FROM lock_waiters AS q
                 WHERE q.namespace = w.namespace AND q.key = w.key
                 ORDER BY q.ticket LIMIT 1) = w.holder, 0) AS first,
       NOT EXISTS (SELECT 1 FROM locks AS l
                   WHERE l.namespace = w.namespace AND l.key = w.key
                     AND l.holder IS NOT NULL) AS free
FROM watched AS w;

-- name: members_purge
DELETE FROM members WHERE namespace = :namespace AND expires_at <= :now;

-- name: member_beat
INSERT INTO members (namespace, member, joined_at, expires_at, held, beat_at, version)
VALUES (:namespace, :member, :now, :expires_at, :held, :now, :version)
ON CONFLICT (namespace, member) DO UPDATE
SET expires_at = excluded.expires_at, held = excluded.held, beat_at = excluded.beat_at,
    version = excluded.version;

-- name: members
SELECT member, joined_at, held FROM members WHERE namespace = :namespace;

-- name: get_roster
SELECT generation, members FROM rosters WHERE namespace = :namespace;

-- name: put_roster
INSERT INTO rosters (namespace, generation, members) VALUES (:namespace, :generation, :members)
ON CONFLICT (namespace) DO UPDATE
SET generation = excluded.generation, members = excluded.members;

-- name: member_holds
UPDATE members SET held = :generation WHERE namespace = :namespace AND member = :member;

-- name: member_leave
DELETE FROM members WHERE namespace = :namespace AND member = :member;

-- name: view_members
-- coordination_view: the live members (a read: ended rows stay for the next heartbeat to delete).
SELECT member, joined_at, expires_at, held, beat_at, version FROM members
WHERE namespace = :namespace AND expires_at > :now
ORDER BY member;

-- name: view_locks_held
-- coordination_view: keys with a live holder, through locks_held (never every key ever locked).
SELECT key, token, holder, expires_at FROM locks INDEXED BY locks_held
WHERE namespace = :namespace AND holder IS NOT NULL AND expires_at > :now
ORDER BY key
LIMIT :limit;

-- name: view_lock_waiters
-- coordination_view: live waiters by key and ticket, with their key's last token (0: the key
-- has no row yet). Waiter rows are few: they end with their lease and retention deletes them.
SELECT w.key, w.holder, w.ticket, w.expires_at, coalesce(l.token, 0) AS token
FROM lock_waiters AS w
LEFT JOIN locks AS l ON l.namespace = w.namespace AND l.key = w.key
WHERE w.namespace = :namespace AND w.expires_at > :now
ORDER BY w.key, w.ticket;

-- name: view_meters
-- coordination_view: meters still in debt at now (those drained go at the next retention).
SELECT key, max(0.0, debt - max(0.0, :now - updated_at) * 1000.0) AS debt, updated_at
FROM meters
WHERE namespace = :namespace AND debt - max(0.0, :now - updated_at) * 1000.0 > 0
ORDER BY key
LIMIT :limit;

-- name: get_meters
SELECT key, debt, updated_at FROM meters
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys));

-- name: put_meters
-- :meters is a JSON array of [key, debt, updated_at].
INSERT INTO meters (namespace, key, debt, updated_at)
SELECT :namespace, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]')
FROM json_each(:meters) WHERE true
ON CONFLICT (namespace, key) DO UPDATE
SET debt = excluded.debt, updated_at = excluded.updated_at;

-- name: rate_slots_purge
-- rate limits (shoal.ports.RateStore): slots, sliding windows, pauses, counters and the cost
-- ledger, with the semantics of the memory reference (shoal.backends.memory.rates); each operation is
-- one transaction of shoal.stores.sqlite_rate. Times are the app's clock, passed as parameters.
-- (This heading sits under the name line: text between blocks would end the block above.)
--
-- Slots of the key that ended leave.
DELETE FROM rate_slots WHERE namespace = :namespace AND key = :key AND expires_at <= :now;

-- name: rate_slots_state
-- After rate_slots_purge (every row is live): how many are held, whether the caller holds one, and
-- when the first of them ends.
SELECT count(*) AS held,
       coalesce(max(holder = :holder), 0) AS mine,
       min(expires_at) AS first_end
FROM rate_slots WHERE namespace = :namespace AND key = :key;

-- name: rate_slot_take
INSERT INTO rate_slots (namespace, key, holder, expires_at)
VALUES (:namespace, :key, :holder, :expires_at)
ON CONFLICT (namespace, key, holder) DO UPDATE SET expires_at = excluded.expires_at;

-- name: rate_slot_renew
UPDATE rate_slots SET expires_at = :expires_at
WHERE namespace = :namespace AND key = :key AND holder = :holder AND expires_at > :now;

-- name: rate_slot_release
DELETE FROM rate_slots WHERE namespace = :namespace AND key = :key AND holder = :holder;

-- name: rate_window_leaving
-- Entries that leave the window (:cutoff is now - window), oldest first (ties in the order they
-- were added: the index ends with the rowid): read through the index, only as far as they go.
SELECT amount FROM rate_window_entries
WHERE namespace = :namespace AND key = :key AND at <= :cutoff
ORDER BY at, rowid;

-- name: rate_window_prune
-- After rate_window_leaving, when there were some.
DELETE FROM rate_window_entries
WHERE namespace = :namespace AND key = :key AND at <= :cutoff;

-- name: rate_window_any
-- After rate_window_prune: whether an entry is left (else the total is reset to exactly 0).
SELECT EXISTS (SELECT 1 FROM rate_window_entries WHERE namespace = :namespace AND key = :key);

-- name: rate_window_stays
-- read_rates, after rate_window_leaving found some: whether an entry stays in the window.
SELECT EXISTS (SELECT 1 FROM rate_window_entries
               WHERE namespace = :namespace AND key = :key AND at > :cutoff);

-- name: rate_slots_live
-- read_rates: the live holders of a slot key (a read: ended rows stay for the next acquire).
SELECT count(*) FROM rate_slots WHERE namespace = :namespace AND key = :key AND expires_at > :now;

-- name: rate_window_total
-- The running total of the key's entries (no row: no entry, 0).
SELECT total FROM rate_windows WHERE namespace = :namespace AND key = :key;

-- name: rate_window_put
INSERT INTO rate_windows (namespace, key, total) VALUES (:namespace, :key, :total)
ON CONFLICT (namespace, key) DO UPDATE SET total = excluded.total;

-- name: rate_window_add
INSERT INTO rate_window_entries (namespace, key, at, amount)
VALUES (:namespace, :key, :now, :amount);

-- name: rate_window_walk
-- After rate_window_prune, for a refused amount that fits the limit on its own: the entries oldest
-- first (ties in the order they were added), which the caller reads only until the ones it has
-- read would, by leaving, make room (their time plus the window is the answer).
SELECT at, amount FROM rate_window_entries
WHERE namespace = :namespace AND key = :key
ORDER BY at, rowid;

-- name: rate_window_clear
-- The entries, then (rate_window_clear_total) their total.
DELETE FROM rate_window_entries WHERE namespace = :namespace AND key = :key;

-- name: rate_window_clear_total
DELETE FROM rate_windows WHERE namespace = :namespace AND key = :key;

-- name: rate_pause_until
-- A later pause in force is kept.
INSERT INTO rate_pauses (namespace, key, until) VALUES (:namespace, :key, :until)
ON CONFLICT (namespace, key) DO UPDATE SET until = max(until, excluded.until)
RETURNING until;

-- name: rate_paused_until
SELECT until FROM rate_pauses WHERE namespace = :namespace AND key = :key AND until > :now;

-- name: rate_counters_get
SELECT key, total FROM rate_counters
WHERE namespace = :namespace AND key IN (SELECT value FROM json_each(:keys));

-- name: rate_counter_put
INSERT INTO rate_counters (namespace, key, total, updated_at)
VALUES (:namespace, :key, :total, :now)
ON CONFLICT (namespace, key) DO UPDATE
SET total = excluded.total, updated_at = excluded.updated_at;

-- name: cost_ledger_add
INSERT INTO cost_ledger (namespace, tenant, run_id, root_id, amount, currency, at, provider,
                         tokens)
VALUES (:namespace, :tenant, :run_id, :root_id, :amount, :currency, :at, :provider, :tokens);

-- name: cost_ledger
-- A page of the ledger (shoal.ports.RateStore.ledger): rows with id > :after in id order, the
-- walk of the namespace's rows through cost_ledger_namespace (migration 11) ending at :limit
-- matches. The other cost_ledger_of_* statements are the same, each walking the index of its
-- narrowest filter (a run, then a root, then a tenant) from :after; the other filters, and
-- :since/:until on at (the writer's clock, not in id order), are checked on the rows walked.
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens
FROM cost_ledger INDEXED BY cost_ledger_namespace
WHERE namespace = :namespace AND id > :after
  AND (:since IS NULL OR at >= :since) AND (:until IS NULL OR at < :until)
ORDER BY id
LIMIT :limit;

-- name: cost_ledger_of_tenant
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens
FROM cost_ledger INDEXED BY cost_ledger_tenant
WHERE namespace = :namespace AND tenant = :tenant AND id > :after
  AND (:since IS NULL OR at >= :since) AND (:until IS NULL OR at < :until)
ORDER BY id
LIMIT :limit;

-- name: cost_ledger_of_root
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens
FROM cost_ledger INDEXED BY cost_ledger_root
WHERE namespace = :namespace AND root_id = :root_id AND id > :after
  AND (:tenant IS NULL OR tenant = :tenant)
  AND (:since IS NULL OR at >= :since) AND (:until IS NULL OR at < :until)
ORDER BY id
LIMIT :limit;

-- name: cost_ledger_of_run
SELECT id, tenant, run_id, root_id, amount, currency, at, provider, tokens
FROM cost_ledger INDEXED BY cost_ledger_run
WHERE namespace = :namespace AND run_id = :run_id AND id > :after
  AND (:tenant IS NULL OR tenant = :tenant) AND (:root_id IS NULL OR root_id = :root_id)
  AND (:since IS NULL OR at >= :since) AND (:until IS NULL OR at < :until)
ORDER BY id
LIMIT :limit;

-- name: prune_meters
-- retention (prune_coordination, prune_rates): each statement deletes at most :limit rows, what is
-- left of the call's budget. (This heading sits under the name line: text between blocks would end
-- the block above.)
--
-- Meters fully drained by :before (a drained meter reads as a missing one). The namespace's meters
-- are walked through the primary key, the walk ending at :limit matches.
DELETE FROM meters
WHERE namespace = :namespace AND updated_at + debt / 1000.0 <= :before
  AND key IN (SELECT key FROM meters
              WHERE namespace = :namespace AND updated_at + debt / 1000.0 <= :before
              LIMIT :limit);

-- name: prune_lock_waiters
-- Waiter rows whose lease ended by :before (the lock rows stay: they keep the fencing counters).
DELETE FROM lock_waiters
WHERE (namespace, key, holder) IN (
    SELECT namespace, key, holder FROM lock_waiters
    WHERE namespace = :namespace AND expires_at <= :before
    LIMIT :limit);

-- name: prune_rate_slots
DELETE FROM rate_slots
WHERE (namespace, key, holder) IN (
    SELECT namespace, key, holder FROM rate_slots
    WHERE namespace = :namespace AND expires_at <= :before
    LIMIT :limit);

-- name: prune_window_entries_find
-- Window entries dated at or before :before, oldest first (ties in the order they were added),
-- through rate_window_entries_at (migration 10).
SELECT rowid, key, amount FROM rate_window_entries INDEXED BY rate_window_entries_at
WHERE namespace = :namespace AND at <= :before
ORDER BY at, rowid
LIMIT :limit;

-- name: prune_window_entries
-- The rows prune_window_entries_find returned (:rowids, a JSON array).
DELETE FROM rate_window_entries WHERE rowid IN (SELECT value FROM json_each(:rowids));

-- name: prune_rate_pauses
DELETE FROM rate_pauses
WHERE (namespace, key) IN (
    SELECT namespace, key FROM rate_pauses
    WHERE namespace = :namespace AND until <= :before
    LIMIT :limit);

-- name: prune_rate_counters
-- Counters last updated before :before, through rate_counters_updated (migration 10), oldest
-- first, then in key order (a provider's circuit counters rely on it).
DELETE FROM rate_counters
WHERE (namespace, key) IN (
    SELECT namespace, key FROM rate_counters INDEXED BY rate_counters_updated
    WHERE namespace = :namespace AND updated_at < :before
    ORDER BY updated_at, key
    LIMIT :limit);

-- the console's reads (shoal.ports.RunInspection) -------------------------------------------
-- search_runs is built in store.py from the filters given (its index chosen there).

-- name: inspect_steps
SELECT seq, name, output, finished, epoch, finished_at, started_at, attempt, retries FROM steps
WHERE run_id = :run_id ORDER BY seq;

-- name: inspect_signals
SELECT id, name, payload, created_at, consumed FROM signals INDEXED BY signals_run
WHERE run_id = :run_id ORDER BY created_at, id;

-- name: inspect_pauses
SELECT * FROM pauses INDEXED BY pauses_run WHERE run_id = :run_id ORDER BY created_at, id;

-- name: inspect_outbox
SELECT * FROM outbox WHERE run_id = :run_id ORDER BY seq, idx;

-- name: inspect_children
SELECT * FROM runs INDEXED BY runs_children
WHERE root_id = :root_id AND id <> root_id ORDER BY id LIMIT :limit;

-- Runs ended per minute: read from the retention index alone (finished_at is in it; the status
-- term is its WHERE), so the cost is the runs that ended in the span.
-- name: run_owners
-- The owners of running runs, through runs_claimed (its cost: the running runs).
SELECT owner, count(*) AS running, max(lease_expires_at) AS lease_until
FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND owner IS NOT NULL
GROUP BY owner
ORDER BY owner
LIMIT :limit;

-- name: finished_per_minute
SELECT CAST((finished_at - :since) / 60 AS INTEGER) AS minute, count(*) AS n
FROM runs INDEXED BY runs_finished
WHERE namespace = :namespace AND status IN ('succeeded', 'failed', 'cancelled')
  AND finished_at >= :since AND finished_at < :until
GROUP BY minute;

-- name: redrive
UPDATE outbox SET dead = 0, attempts = 0, next_at = :now
WHERE id = :id AND namespace = :namespace AND dead = 1
RETURNING *;

-- name: get_outbox
SELECT * FROM outbox WHERE id = :id AND namespace = :namespace;

-- name: held_running
-- The runs in running per (workflow, tenant) of the workflows given (a JSON array): what
-- max_running and max_running_per_tenant count, read by the index of claimed runs.
SELECT workflow, tenant, count(*) AS n FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND workflow IN (SELECT value FROM json_each(:workflows))
GROUP BY workflow, tenant;

-- name: held_first_starts
-- A workflow's runs of one rate key first started (started_at) after :since, up to :limit: the
-- claim's count of a rate window, walking runs_rate_starts.
SELECT count(*) AS n FROM (
    SELECT 1 FROM runs INDEXED BY runs_rate_starts
    WHERE namespace = :namespace AND workflow = :workflow
      AND rate_key IS NOT NULL AND rate_key = coalesce(:rate_key, '')
      AND started_at IS NOT NULL AND started_at > :since
    LIMIT :limit);

-- name: held_rate_key
SELECT rate_key FROM runs WHERE id = :id AND namespace = :namespace;

-- name: held_count_due
-- A workflow's due queued runs, up to :cap, walking runs_queued: of :tenants only (a JSON
-- array, or NULL: every tenant), none of :skip; with :first_only, never started; with
-- :key_limit, never started and of a key with at least :key_limit holders (one probe of
-- runs_key_holder each); with :rate_limit, see below.
SELECT count(*) AS n FROM (
    SELECT 1 FROM runs r INDEXED BY runs_queued
    WHERE r.namespace = :namespace AND r.status = 'queued' AND r.held = 0
      AND r.workflow = :workflow AND r.run_at <= :now
      AND (:tenants IS NULL OR r.tenant IN (SELECT value FROM json_each(:tenants)))
      AND r.tenant NOT IN (SELECT value FROM json_each(:skip))
      AND (:first_only = 0 OR r.started_at IS NULL)
      AND (:key_limit IS NULL OR (r.concurrency_key IS NOT NULL AND (
          SELECT count(*) FROM runs h INDEXED BY runs_key_holder
          WHERE h.namespace = r.namespace AND h.workflow = r.workflow
            AND h.concurrency_key = r.concurrency_key
            AND h.concurrency_key IS NOT NULL AND h.started_at IS NOT NULL
            AND h.status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
      ) >= :key_limit))
      -- with :rate_limit: never started, of a window (its rate key's first starts after
      -- :rate_since) full or not (:rate_full), walking runs_rate_starts
      AND (:rate_limit IS NULL OR (r.started_at IS NULL AND ((
          SELECT count(*) FROM (
              SELECT 1 FROM runs o INDEXED BY runs_rate_starts
              WHERE o.namespace = r.namespace AND o.workflow = r.workflow
                AND o.rate_key IS NOT NULL AND o.rate_key = coalesce(r.rate_key, '')
                AND o.started_at IS NOT NULL AND o.started_at > :rate_since
              LIMIT :rate_limit)) >= :rate_limit) = :rate_full))
    LIMIT :cap);

-- name: held_key_holders
SELECT count(*) AS n FROM (
    SELECT 1 FROM runs INDEXED BY runs_key_holder
    WHERE namespace = :namespace AND workflow = :workflow AND concurrency_key = :key
      AND concurrency_key IS NOT NULL AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')
    LIMIT :cap);
