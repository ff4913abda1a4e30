-- The current shoal schema on PostgreSQL, as one script: what a new store gets.
-- PostgresStore.migrate runs it, in one transaction under the schema's advisory lock, on a schema
-- that holds no shoal store yet (version 0); a schema at an older version is brought forward by
-- the missing migrations/NNNN_*.sql instead.
--
-- Changing the schema: add the next migrations/NNNN_<what>.sql (for the schemas already there)
-- AND make the same change here (a column that ALTER TABLE adds goes last in its table, where
-- ALTER TABLE puts it), then record the new version in the INSERT at the end of this file.
-- tests/contract/test_schema_drift.py builds a store migration by migration and another from this
-- file, and fails with a diff of the two schemas when they differ.
--
-- Applied inside the store's own schema (search_path). The same tables and columns as SQLite's.
-- Times are seconds since the epoch from the app's Clock (double precision), never from the server.
-- JSON values are kept as their text (as on SQLite), so key order, numbers and escapes come back
-- exactly as they were written.

-- Runs, their step checkpoints, signals, and the workflow registry (version 1) -----------------

CREATE TABLE runs (
    id               text PRIMARY KEY,
    namespace        text NOT NULL,
    tenant           text NOT NULL,
    workflow         text NOT NULL,
    input            text NOT NULL,
    output           text,
    error            text,
    status           text NOT NULL CHECK (status IN ('queued', 'running', 'sleeping', 'waiting',
                                                    'interrupted', 'succeeded', 'failed',
                                                    'cancelled')),
    priority         integer NOT NULL DEFAULT 0,
    created_at       double precision NOT NULL,
    run_at           double precision,   -- when a queued/sleeping/waiting run is due; NULL: never
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL,
    concurrency_key  text,
    idempotency_key  text,
    owner            text,
    lease_expires_at double precision,
    lease_epoch      bigint NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    version          text,
    parent_id        text,
    root_id          text NOT NULL,
    wait_for         text,
    held             boolean NOT NULL DEFAULT false,  -- parked by admission control
    started_at       double precision,
    finished_at      double precision,
    -- why a run is delivered again (observers' on_run_resume): dispatched (first start, or a
    -- retry), woke, resumed, recovered; set by the claim
    resume_reason    text,
    traceback        text,  -- a failed run's last attempt's (at most 64 KiB, its end)
    has_tree_keys    boolean NOT NULL DEFAULT false,  -- a root whose tree stored keys (version 16)
    progress         text,  -- the latest ctx.progress, as JSON (version 19)
    progress_at      double precision,  -- when the run reported it
    trace_context    text,  -- the W3C trace context it continues, JSON (version 22)
    key_slot         integer NOT NULL DEFAULT 0,  -- which of its key's concurrency_limit places it holds (version 24)
    rate_key         text  -- the key its rate_limit counts its first start under, '' none, NULL no rate (version 26)
);

-- invariant 5: one run per (tenant, workflow, idempotency key) in a namespace
CREATE UNIQUE INDEX runs_idempotency ON runs (namespace, tenant, workflow, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- invariant 4, enforced by the database: a started, unfinished run holds its concurrency key, and
-- a claim sets started_at, so two concurrent claims of one key cannot both commit; a run holds one
-- of its key's concurrency_limit slots (key_slot: 0 when the limit is 1).
CREATE UNIQUE INDEX runs_key_holder ON runs (namespace, workflow, concurrency_key, key_slot)
    WHERE concurrency_key IS NOT NULL AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted');
-- the first due run of a free key is the only one of that key a claim may take
CREATE INDEX runs_key_queued ON runs (namespace, workflow, concurrency_key, priority DESC,
                                      created_at, id)
    WHERE concurrency_key IS NOT NULL AND status = 'queued' AND started_at IS NULL AND NOT held;
-- rate_limit: the first starts of a (workflow, rate key), counted over a window (the runs of
-- rated workflows only: rate_key NULL is a workflow without a rate, '' a rate without a key)
CREATE INDEX runs_rate_starts ON runs (namespace, workflow, rate_key, started_at)
    WHERE rate_key IS NOT NULL AND started_at IS NOT NULL;
-- the claim scan: only live rows are indexed, so its cost does not grow with finished runs
CREATE INDEX runs_queued ON runs (namespace, priority DESC, created_at, id)
    WHERE status = 'queued' AND NOT held;
-- fairness="tenant": the tenants with queued runs of a workflow (a skip scan) and each one's
-- first runs in claim order (version 27)
CREATE INDEX runs_fair_queued ON runs (namespace, workflow, tenant, priority DESC, created_at, id)
    WHERE status = 'queued' AND NOT held;
CREATE INDEX runs_timed ON runs (namespace, run_at)
    WHERE status IN ('sleeping', 'waiting');
CREATE INDEX runs_claimed ON runs (namespace, status, lease_expires_at)
    WHERE status IN ('running', 'interrupted');
CREATE INDEX runs_held ON runs (namespace, created_at, id) WHERE held;
-- A namespace's runs by id (listings, the console). It costs every run an entry at each of its
-- three writes (no update of a run is HOT: its status, in the partial indexes' conditions,
-- changes), about a sixth of a no-op run's server time; walking the primary key instead reads
-- the whole table for a small namespace in a schema several apps share (the default schema is
-- shoal for every app), so it stays.
CREATE INDEX runs_namespace ON runs (namespace, id);
-- the console's reads (version 15): runs newest first by a status runs pass through rarely
-- (queued, running and succeeded rows are the bulk of runs_namespace's newest, and indexing
-- them would cost every dispatch and claim an index write), by idempotency key alone, by
-- concurrency key alone
CREATE INDEX runs_status ON runs (namespace, status, id)
    WHERE status IN ('failed', 'cancelled', 'sleeping', 'waiting', 'interrupted');
CREATE INDEX runs_idempotency_key ON runs (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_concurrency_key ON runs (namespace, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL;
-- retention: finished runs are pruned oldest first
CREATE INDEX runs_finished ON runs (namespace, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');

CREATE TABLE steps (
    run_id      text NOT NULL,
    seq         integer NOT NULL,
    name        text NOT NULL,
    output      text,
    finished    boolean NOT NULL,
    epoch       bigint NOT NULL,   -- the lease epoch that wrote it
    finished_at double precision,
    started_at  double precision,      -- when its function began (version 18)
    attempt     integer,   -- the run's attempt that executed it
    retries     integer,   -- in-place retries it took
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE signals (
    id         text PRIMARY KEY,
    run_id     text NOT NULL,
    name       text NOT NULL,
    payload    text,
    created_at double precision NOT NULL,
    consumed   boolean NOT NULL DEFAULT false
);
CREATE INDEX signals_pending ON signals (run_id, name, created_at, id) WHERE NOT consumed;
CREATE INDEX signals_run ON signals (run_id);

CREATE TABLE workflows (
    namespace     text NOT NULL,
    name          text NOT NULL,
    options       text NOT NULL,      -- JSON: what dispatch by name needs (max_attempts, ...)
    registered_at double precision NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- Which instances serve each workflow (`shoal workflows`): per start of an instance and workflow
-- it registers, the time of that registration; rows of a namespace older than
-- WORKFLOW_INSTANCE_RETENTION go at the next registration in that namespace (version 12).
CREATE TABLE workflow_instances (
    namespace     text NOT NULL,
    workflow      text NOT NULL,
    instance      text NOT NULL,
    registered_at double precision NOT NULL,
    PRIMARY KEY (namespace, workflow, instance)
);
CREATE INDEX workflow_instances_registered ON workflow_instances (namespace, registered_at);

-- Paused workflows: no run of the workflow starts while its row is here, of every tenant when
-- tenant is '', else of that tenant; the claims probe the primary key (version 23).
CREATE TABLE paused_workflows (
    namespace text NOT NULL,
    workflow  text NOT NULL,
    tenant    text NOT NULL,
    paused_at double precision NOT NULL,
    PRIMARY KEY (namespace, workflow, tenant)
);

-- Tenant weights under fairness="tenant" (no row: 1), read by every claim (version 27).
CREATE TABLE tenant_weights (
    namespace text NOT NULL,
    tenant    text NOT NULL,
    weight    double precision NOT NULL CHECK (weight > 0),
    PRIMARY KEY (namespace, tenant)
);

-- Pauses, the human decisions runs wait for (approvals; version 2) -----------------------------

CREATE TABLE pauses (
    id           text PRIMARY KEY,
    namespace    text NOT NULL,
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    name         text NOT NULL,
    request      text,
    status       text NOT NULL CHECK (status IN ('pending', 'resolved')),  -- exactly once
    decision     text,                -- JSON {"approved", "data", "by", "reason"}
    created_at   double precision NOT NULL,
    expires_at   double precision,
    resolved_at  double precision,
    notified     boolean NOT NULL DEFAULT false,
    notify_until double precision     -- an instance is sending its notification until then
);
CREATE INDEX pauses_pending ON pauses (namespace, created_at, id) WHERE status = 'pending';
CREATE INDEX pauses_expiring ON pauses (namespace, expires_at) WHERE status = 'pending';
CREATE INDEX pauses_unnotified ON pauses (namespace, created_at, id) WHERE NOT notified;
CREATE INDEX pauses_resolved ON pauses (namespace, resolved_at) WHERE status = 'resolved';
CREATE INDEX pauses_of_run ON pauses (run_id) WHERE status = 'pending';
CREATE INDEX pauses_run ON pauses (run_id, created_at);   -- the console (version 15)

-- Run trees: child runs, request-wide state (version 3) ----------------------------------------

-- tenant: its tree's root run's (insert_tree_key takes it from the root's row); the default is
-- what a key whose root run was gone got when version 9 added the column (a constant default:
-- adding the column rewrote no row).
CREATE TABLE tree_keys (
    root_id    text NOT NULL,
    key        text NOT NULL,
    value      text,
    claimant   text NOT NULL,     -- the step that stored it (a re-executed step gets True again)
    created_at double precision NOT NULL,
    tenant     text NOT NULL DEFAULT 'default',
    PRIMARY KEY (root_id, key)
);

-- the unfinished runs of a tree, which cancelling its root cancels
CREATE INDEX runs_children ON runs (root_id) WHERE id <> root_id;

-- Whichever statement ends a run (a settlement, recovery, a cancellation): a parent waiting for it
-- becomes due at once, and a root drops its tree's keys. The wake-up notifies the store's channel,
-- 'shoal_' followed by the schema's name (PostgresStore.channel): the table's own schema is the
-- store's, so the trigger needs nothing from the statement that fired it. The function's
-- search_path is the schema it was created in (FROM CURRENT: the script runs with the store's
-- schema as search_path), so it finds its tables whatever the session's search_path is.
-- VOLATILE (the default), so each statement sees what concurrent transactions have committed
-- since the firing statement began: a parent that wait_child parked after locking the child is
-- seen waiting once the child's row lock is granted.
CREATE FUNCTION runs_ended() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.parent_id IS NOT NULL THEN
        UPDATE runs SET run_at = NEW.finished_at
        WHERE id = NEW.parent_id AND status = 'waiting' AND wait_for = 'shoal.child:' || NEW.id;
        IF FOUND THEN
            PERFORM pg_notify('shoal_' || TG_TABLE_SCHEMA, '');
        END IF;
    END IF;
    IF NEW.id = NEW.root_id THEN
        DELETE FROM tree_keys WHERE root_id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;

-- Only for the runs that need it (version 16): a child, or a root whose tree stored keys
-- (insert_tree_key sets has_tree_keys on the root); any other run pays only the WHEN.
CREATE TRIGGER runs_ended AFTER UPDATE OF status ON runs
FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled')
      AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled')
      AND (NEW.parent_id IS NOT NULL OR NEW.has_tree_keys))
EXECUTE FUNCTION runs_ended();

-- The counts of final runs that stats() reads (version 14) ------------------------------------
-- Whichever statement makes a run final, makes a final run live again (retry) or deletes it
-- (prune) inserts delta rows: +n or -n for (namespace, workflow, status, the second the runs
-- finished). Only inserts, never an update of a shared counter row: concurrent settlements never
-- wait for each other here (a counter row updated by every settlement would serialise the
-- workers). shoal's own statements insert theirs (one row per group of a batch: see
-- queries.sql); for any other session (shoal code older than version 14 still running beside a
-- newer one during a rollout, a psql session), triggers insert one per run.
-- fold_counts (the retention service, every poll) sums a namespace's rows into one per
-- (workflow, status, second) for the last two minutes and one per (workflow, status) before
-- (bucket NULL), so stats reads a few rows per workflow and status.

CREATE TABLE run_counts (
    namespace text NOT NULL,
    workflow  text NOT NULL,
    status    text NOT NULL,
    bucket    bigint,           -- floor(finished_at); NULL: folded, ended two minutes ago or more
    n         bigint NOT NULL   -- runs counted (a delta: +1, -1, or a folded sum)
);
-- stats and fold_counts read a namespace's rows through it, never the whole table: a burst of
-- settlements leaves the table long (the folded rows are inserted at its end, so VACUUM cannot
-- cut it short), and other namespaces may share it.
CREATE INDEX run_counts_namespace ON run_counts (namespace);

CREATE FUNCTION runs_counted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status
       AND OLD.finished_at IS NOT DISTINCT FROM NEW.finished_at THEN
        RETURN NULL;
    END IF;
    IF OLD.status IN ('succeeded', 'failed', 'cancelled') THEN
        INSERT INTO run_counts (namespace, workflow, status, bucket, n)
        VALUES (OLD.namespace, OLD.workflow, OLD.status, floor(OLD.finished_at), -1);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        INSERT INTO run_counts (namespace, workflow, status, bucket, n)
        VALUES (NEW.namespace, NEW.workflow, NEW.status, floor(NEW.finished_at), 1);
    END IF;
    RETURN NULL;
END
$$;

-- Only for sessions that do not count themselves: shoal's own connections set shoal.counted to
-- 'on', and their statements insert one row per (namespace, workflow, status, second) of a
-- batch instead of one per run (this function, run by run, cost a settlement a quarter more
-- server time). The WHEN condition is all a statement of shoal's pays: checked once per row,
-- compiled once per statement (about 3 us: a longer one, 8 us); the function sorts out the rest.
-- No trigger on INSERT: shoal inserts no run final, and one with a false WHEN still cost each
-- dispatch about 7 us. Rows inserted final by hand are not counted (write through shoal).
CREATE TRIGGER runs_recounted AFTER UPDATE OF status, finished_at ON runs
FOR EACH ROW
WHEN (current_setting('shoal.counted', true) IS DISTINCT FROM 'on')
EXECUTE FUNCTION runs_counted();

CREATE TRIGGER runs_uncounted AFTER DELETE ON runs
FOR EACH ROW
WHEN (current_setting('shoal.counted', true) IS DISTINCT FROM 'on')
EXECUTE FUNCTION runs_counted();

-- The outbox, side effects recorded with the step that sent them (version 4) -------------------

CREATE TABLE outbox (
    id           text PRIMARY KEY,
    namespace    text NOT NULL,
    run_id       text NOT NULL,
    seq          integer NOT NULL,   -- the step that sent it
    idx          integer NOT NULL,   -- its place among that step's entries
    topic        text NOT NULL,
    payload      text,
    created_at   double precision NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    next_at      double precision NOT NULL,  -- due then; a delivering instance holds it until then
    delivered_at double precision,
    dead         boolean NOT NULL DEFAULT false,
    error        text,
    trace_context text,              -- its step's W3C trace context, JSON (version 22)
    UNIQUE (run_id, seq, idx)        -- invariant 3: a step's entries exist once (and prune's probe)
);
-- the claim scan: only entries still to deliver are indexed, so its cost does not grow with
-- delivered ones, and it reads due entries only
CREATE INDEX outbox_due ON outbox (namespace, next_at) WHERE delivered_at IS NULL AND NOT dead;
CREATE INDEX outbox_dead ON outbox (namespace, created_at, id) WHERE dead;

-- Coordination (shoal.coord.base): locks, membership, meters (version 6) -----------------------
-- Every key is scoped by the app's namespace.
--
-- Concurrency (shoal.backends.postgres.coord): a lock key's row is locked (FOR UPDATE, keys in
-- "C" order) before anything of that key is read or written, its waiter rows included; the
-- membership of a namespace is serialized by an advisory transaction lock; meter rows are locked
-- in "C" order. Lock and meter rows are never deleted, so the lock order is the same for all.

-- invariant 7: a key has at most one holder with a live lease; tokens strictly increase. A row
-- outlives its holder (holder NULL) because it keeps the key's fencing counter.
CREATE TABLE locks (
    namespace  text NOT NULL,
    key        text NOT NULL,
    holder     text,                              -- NULL: released (an ended lease holds nothing)
    token      bigint NOT NULL DEFAULT 0,         -- the last fencing token granted on this key
    expires_at double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, key)
);
-- The keys a holder holds: the console finds them without walking every key ever locked
-- (version 17).
CREATE INDEX locks_held ON locks (namespace, key COLLATE "C") WHERE holder IS NOT NULL;

-- The FIFO queue of each key. A waiter of several keys has one row per key, all with its ticket.
CREATE TABLE lock_waiters (
    namespace  text NOT NULL,
    key        text NOT NULL,
    holder     text NOT NULL,
    ticket     bigint NOT NULL,
    expires_at double precision NOT NULL,         -- a waiter that stops asking leaves the queue
    PRIMARY KEY (namespace, key, holder)
);
CREATE INDEX lock_waiters_queue ON lock_waiters (namespace, key, ticket);

-- The last ticket given in a namespace: tickets are ordered across keys.
CREATE TABLE lock_tickets (
    namespace text PRIMARY KEY,
    ticket    bigint NOT NULL
);

-- invariant 8: members heartbeat; a row ends at expires_at. held: the generation it acts on.
CREATE TABLE members (
    namespace  text NOT NULL,
    member     text NOT NULL,
    joined_at  double precision NOT NULL,
    expires_at double precision NOT NULL,
    held       bigint,
    beat_at    double precision,              -- the latest heartbeat's now (version 17)
    version    text,                          -- the member's code version (version 17)
    PRIMARY KEY (namespace, member)
);

-- The roster (member ids in "C" order, as Python sorts them) and its generation, per namespace.
CREATE TABLE rosters (
    namespace  text PRIMARY KEY,
    generation bigint NOT NULL,
    members    text[] NOT NULL
);

-- invariant 9: a debt in milliseconds per key, drained by the app's clock.
CREATE TABLE meters (
    namespace  text NOT NULL,
    key        text NOT NULL,
    debt       double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- Rate-limit state (shoal.ports.RateStore): slots, sliding windows, pauses, counters and the cost
-- ledger (versions 7, 8, 10, 11). Every key is scoped by the app's namespace.
--
-- Concurrency (shoal.backends.postgres.rates): the operations on one slot key, or on one window
-- key, are serialized by an advisory transaction lock of that key (its rows come and go, so there
-- may be no row to lock); counter rows are locked in "C" order, created first if missing, and
-- never deleted; a pause is one upsert.
--
-- Retention (prune_coordination, prune_rates) deletes a bounded batch per poll. An index serves
-- it only where a prune would otherwise walk a table that grows with use: rate_window_entries_at
-- (a busy window holds about a window of entries per key, of many keys; the old ones of every key
-- are found from the oldest, ties in the order they were added) and rate_counters_updated (one
-- row per counter key ever used, the idle ones found without walking the live ones). Meters, lock
-- waiters, rate slots and rate pauses need none: their prunes walk the namespace's rows through
-- the primary key (meters: the condition involves the debt) or they are purged per key by every
-- acquire.

-- At most max_slots live holders per key: a row is a holder's slot until expires_at. Rows that
-- ended are deleted by the next slot_acquire of the key.
CREATE TABLE rate_slots (
    namespace  text NOT NULL,
    key        text NOT NULL,
    holder     text NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (namespace, key, holder)
);

-- A sliding window's entries: (at, amount), and seq, the order they were added in. Entries that
-- left the window (at <= now - window) are deleted by the next window_add of the key, so a key
-- keeps about one window of entries. The leaving ones are found from the oldest, and a refused
-- add walks them in (at, seq) order (as the memory reference keeps them), reading the index in
-- order without a sort.
CREATE TABLE rate_window_entries (
    namespace text NOT NULL,
    key       text NOT NULL,
    at        double precision NOT NULL,
    amount    double precision NOT NULL,
    seq       bigint GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX rate_window_entries_key ON rate_window_entries (namespace, key, at, seq);
CREATE INDEX rate_window_entries_at ON rate_window_entries (namespace, at, seq);

-- One row per window key: the sum of its entries, so that a window_add costs the entries leaving
-- the window, not the whole window. window_add (after the key's advisory lock) subtracts the
-- entries leaving and adds the one it adds; the total is set to exactly 0 when no entry is left
-- (no rounding drift outlives an empty window); window_clear deletes the row with the entries.
CREATE TABLE rate_windows (
    namespace text NOT NULL,
    key       text NOT NULL,
    total     double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- The time before which a key is paused (a later pause is kept).
CREATE TABLE rate_pauses (
    namespace text NOT NULL,
    key       text NOT NULL,
    until     double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- Totals that only the caller resets (the spend behind budgets); updated_at is for pruning.
CREATE TABLE rate_counters (
    namespace  text NOT NULL,
    key        text NOT NULL,
    total      double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX rate_counters_updated ON rate_counters (namespace, updated_at);

-- The cost ledger: one row per spend added with its counters. It is read in pages,
-- ledger(after=id), in id order, filtered by tenant, root or run: every read walks the index of
-- its narrowest filter from (namespace, ..., after), ending at the page's size
-- (cost_ledger_namespace: no filter; the primary key alone would walk every namespace's rows).
-- A page must never skip a row that commits later with a smaller id: counter_add takes an
-- advisory transaction lock of the namespace's ledger before its row takes its id from the
-- sequence, and holds it until it commits, so the rows of a namespace commit in id order (and a
-- reader that sees a row sees every row before it). Ids of different namespaces interleave.
CREATE TABLE cost_ledger (
    id        bigserial PRIMARY KEY,
    namespace text NOT NULL,
    tenant    text NOT NULL,
    run_id    text,
    root_id   text,
    amount    double precision NOT NULL,
    currency  text NOT NULL,
    at        double precision NOT NULL,
    provider  text,
    tokens    bigint
);
CREATE INDEX cost_ledger_tenant ON cost_ledger (namespace, tenant, id);
CREATE INDEX cost_ledger_root ON cost_ledger (namespace, root_id, id);
CREATE INDEX cost_ledger_namespace ON cost_ledger (namespace, id);
CREATE INDEX cost_ledger_run ON cost_ledger (namespace, run_id, id);

-- LangGraph checkpoints (version 20) ----------------------------------------------------------

CREATE TABLE graph_checkpoints (
    namespace      text NOT NULL,
    tenant         text NOT NULL,
    thread_id      text NOT NULL,
    checkpoint_ns  text NOT NULL,
    checkpoint_id  text COLLATE "C" NOT NULL,
    parent_id      text,
    run_id         text,
    type           text NOT NULL,
    checkpoint     bytea NOT NULL,
    metadata       jsonb NOT NULL,
    created_at     double precision NOT NULL,
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX graph_checkpoints_run ON graph_checkpoints (namespace, tenant, run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE graph_writes (
    namespace      text NOT NULL,
    tenant         text NOT NULL,
    thread_id      text NOT NULL,
    checkpoint_ns  text NOT NULL,
    checkpoint_id  text COLLATE "C" NOT NULL,
    task_id        text NOT NULL,
    idx            integer NOT NULL,
    channel        text NOT NULL,
    type           text NOT NULL,
    value          bytea NOT NULL,
    task_path      text NOT NULL DEFAULT '',
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- The schema version: every migration this script holds, recorded as the store records one it
-- applies (shoal_migrations is the store's own table, created before this script runs).

INSERT INTO shoal_migrations (version, name, applied_at)
SELECT version, name, extract(epoch FROM clock_timestamp())
FROM (VALUES (1, '0001_runs.sql'),
             (2, '0002_pauses.sql'),
             (3, '0003_trees.sql'),
             (4, '0004_outbox.sql'),
             (5, '0005_versions.sql'),
             (6, '0006_coordination.sql'),
             (7, '0007_rate_limits.sql'),
             (8, '0008_rate_window_totals.sql'),
             (9, '0009_tree_tenants.sql'),
             (10, '0010_retention.sql'),
             (11, '0011_ledger_paging.sql'),
             (12, '0012_workflow_instances.sql'),
             (13, '0013_run_tracebacks.sql'),
             (14, '0014_run_counts.sql'),
             (15, '0015_console_reads.sql'),
             (16, '0016_tree_flag.sql'),
             (17, '0017_member_beats.sql'),
             (18, '0018_step_timeline.sql'),
             (19, '0019_run_progress.sql'),
             (20, '0020_graph_checkpoints.sql'),
             (21, '0021_ledger_tokens.sql'),
             (22, '0022_trace_context.sql'),
             (23, '0023_paused_workflows.sql'),
             (24, '0024_concurrency_limits.sql'),
             (25, '0025_running_caps.sql'),
             (26, '0026_rate_limits.sql'),
             (27, '0027_tenant_fairness.sql')) AS applied (version, name);
