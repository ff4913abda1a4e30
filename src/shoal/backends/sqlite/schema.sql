-- The current shoal schema on SQLite, as one script: what a new store gets. SQLiteStore.migrate
-- runs it, in one BEGIN IMMEDIATE transaction, on a file that holds no shoal schema yet (version
-- 0); a file at an older version is brought forward by the missing migrations/NNNN_*.sql instead.
--
-- Changing the schema: add the next migrations/NNNN_<what>.sql (for the files already there) AND
-- make the same change here (a column that ALTER TABLE adds goes last in its table, where ALTER
-- TABLE puts it), then record the new version in the INSERT at the end of this file.
-- tests/contract/test_schema_drift.py builds a store migration by migration and another from this
-- file, and fails with a diff of the two schemas when they differ.
--
-- Times are seconds since the epoch from the app's Clock (REAL), never from SQLite.

-- runs, their step checkpoints, signals, and the workflow registry (version 1) ---------------

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    namespace        TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    workflow         TEXT NOT NULL,
    input            TEXT NOT NULL,
    output           TEXT,
    error            TEXT,
    status           TEXT NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    run_at           REAL,                -- when a queued/sleeping/waiting run is due; NULL: never
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    concurrency_key  TEXT,
    idempotency_key  TEXT,
    owner            TEXT,
    lease_expires_at REAL,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    version          TEXT,
    parent_id        TEXT,
    root_id          TEXT NOT NULL,
    wait_for         TEXT,
    held             INTEGER NOT NULL DEFAULT 0,  -- parked by admission control
    started_at       REAL,
    finished_at      REAL,
    resume_reason    TEXT,                -- why it is delivered again (observers' on_run_resume)
    traceback        TEXT,                -- a failed run's last attempt's (at most 64 KiB, its end)
    progress         TEXT,                -- the latest ctx.progress, as JSON (version 19)
    progress_at      REAL,                -- when the run reported it
    trace_context    TEXT,                -- the W3C trace context it continues, JSON (version 22)
    key_slot         INTEGER NOT NULL DEFAULT 0, -- which of its key's concurrency_limit places it holds (version 24)
    rate_key         TEXT                 -- the key its rate_limit counts its first start under, '' none, NULL no rate (version 26)
);

-- invariant 5: one run per (tenant, workflow, idempotency key) in a namespace
CREATE UNIQUE INDEX runs_idempotency ON runs (namespace, tenant, workflow, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- the claim scan: only live rows are indexed, so its cost does not grow with finished runs
CREATE INDEX runs_queued ON runs (namespace, priority DESC, created_at, id)
    WHERE status = 'queued' AND held = 0;
-- fairness="tenant": the tenants with queued runs of a workflow (a skip scan) and each one's
-- first runs in claim order (version 27)
CREATE INDEX runs_fair_queued ON runs (namespace, workflow, tenant, priority DESC, created_at, id)
    WHERE status = 'queued' AND held = 0;
CREATE INDEX runs_timed ON runs (namespace, run_at)
    WHERE status IN ('sleeping', 'waiting');
CREATE INDEX runs_claimed ON runs (namespace, status, lease_expires_at)
    WHERE status IN ('running', 'interrupted');
-- invariant 4, enforced by the database: a run holds its concurrency key from its first start
-- until it ends, and at most one run of a (workflow, key) holds each of its slots (key_slot, in
-- [0, concurrency_limit))
CREATE UNIQUE INDEX runs_key_holder ON runs (namespace, workflow, concurrency_key, key_slot)
    WHERE concurrency_key IS NOT NULL AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted');
-- rate_limit: the first starts of a (workflow, rate key), counted over a window (the runs of
-- rated workflows only: rate_key NULL is a workflow without a rate, '' a rate without a key)
CREATE INDEX runs_rate_starts ON runs (namespace, workflow, rate_key, started_at)
    WHERE rate_key IS NOT NULL AND started_at IS NOT NULL;
CREATE INDEX runs_held ON runs (namespace, created_at, id) WHERE held = 1;
-- retention: finished runs are pruned oldest first
CREATE INDEX runs_finished ON runs (namespace, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
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

CREATE TABLE steps (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    name        TEXT NOT NULL,
    output      TEXT,
    finished    INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,   -- the lease epoch that wrote it
    finished_at REAL,
    started_at  REAL,      -- when its function began (version 18)
    attempt     INTEGER,   -- the run's attempt that executed it
    retries     INTEGER,   -- in-place retries it took
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE signals (
    id         TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    payload    TEXT,
    created_at REAL NOT NULL,
    consumed   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX signals_pending ON signals (run_id, name, id) WHERE consumed = 0;
CREATE INDEX signals_run ON signals (run_id);

CREATE TABLE workflows (
    namespace     TEXT NOT NULL,
    name          TEXT NOT NULL,
    options       TEXT NOT NULL,      -- JSON: what dispatch by name needs (max_attempts, ...)
    registered_at REAL NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;

-- Which instances serve each workflow (`shoal workflows`): per start of an instance and workflow
-- it registers, the time of that registration; rows of a namespace older than
-- WORKFLOW_INSTANCE_RETENTION go at the next registration in that namespace (version 12).
CREATE TABLE workflow_instances (
    namespace     TEXT NOT NULL,
    workflow      TEXT NOT NULL,
    instance      TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (namespace, workflow, instance)
) WITHOUT ROWID;
CREATE INDEX workflow_instances_registered ON workflow_instances (namespace, registered_at);

-- Paused workflows: no run of the workflow starts while its row is here, of every tenant when
-- tenant is '', else of that tenant; the claims probe the primary key (version 23).
CREATE TABLE paused_workflows (
    namespace TEXT NOT NULL,
    workflow  TEXT NOT NULL,
    tenant    TEXT NOT NULL,
    paused_at REAL NOT NULL,
    PRIMARY KEY (namespace, workflow, tenant)
) WITHOUT ROWID;

-- Tenant weights under fairness="tenant" (no row: 1), read by every claim (version 27).
CREATE TABLE tenant_weights (
    namespace TEXT NOT NULL,
    tenant    TEXT NOT NULL,
    weight    REAL NOT NULL CHECK (weight > 0),
    PRIMARY KEY (namespace, tenant)
) WITHOUT ROWID;

-- pauses, the human decisions runs wait for (approvals; version 2) ---------------------------

CREATE TABLE pauses (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    request      TEXT,
    status       TEXT NOT NULL,       -- pending -> resolved, exactly once
    decision     TEXT,                -- JSON {"approved", "data", "by", "reason"}
    created_at   REAL NOT NULL,
    expires_at   REAL,
    resolved_at  REAL,
    notified     INTEGER NOT NULL DEFAULT 0,
    notify_until REAL                 -- an instance is sending its notification until then
);
CREATE INDEX pauses_pending ON pauses (namespace, created_at, id) WHERE status = 'pending';
CREATE INDEX pauses_expiring ON pauses (namespace, expires_at) WHERE status = 'pending';
CREATE INDEX pauses_unnotified ON pauses (namespace, created_at, id) WHERE notified = 0;
CREATE INDEX pauses_resolved ON pauses (namespace, resolved_at) WHERE status = 'resolved';
CREATE INDEX pauses_of_run ON pauses (run_id) WHERE status = 'pending';
CREATE INDEX pauses_run ON pauses (run_id, created_at);   -- the console (version 15)

-- run trees: child runs, request-wide state (version 3) --------------------------------------

-- tenant: its tree's root run's (insert_tree_key takes it from the root's row); the default is
-- what a key whose root run was gone got when version 9 added the column.
CREATE TABLE tree_keys (
    root_id    TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT,
    claimant   TEXT NOT NULL,     -- the step that stored it (a re-executed step gets True again)
    created_at REAL NOT NULL,
    tenant     TEXT NOT NULL DEFAULT 'default',
    PRIMARY KEY (root_id, key)
) WITHOUT ROWID;

CREATE INDEX runs_children ON runs (root_id) WHERE id <> root_id;

-- Whichever statement ends a run (settle, recovery, cancel): a parent waiting for it becomes
-- due at once, and a root drops its tree's keys; and the run is counted in run_counts (version
-- 14: here rather than in a trigger of its own, which cost each settlement 5 us more).
CREATE TRIGGER runs_ended AFTER UPDATE OF status ON runs
WHEN NEW.status IN ('succeeded', 'failed', 'cancelled')
 AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled')
BEGIN
    UPDATE runs SET run_at = NEW.finished_at
    WHERE NEW.parent_id IS NOT NULL AND id = NEW.parent_id AND status = 'waiting'
      AND wait_for = 'shoal.child:' || NEW.id;
    DELETE FROM tree_keys WHERE NEW.id = NEW.root_id AND root_id = NEW.id;
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    VALUES (NEW.namespace, NEW.workflow, NEW.status,
            CAST(NEW.finished_at AS INTEGER)
            - (NEW.finished_at < CAST(NEW.finished_at AS INTEGER)), 1);
END;

-- the counts of final runs that stats() reads (version 14) ------------------------------------
-- Whichever statement makes a run final (runs_ended, above) or deletes one (prune), a trigger
-- inserts a delta row (+1 or -1) for (namespace, workflow, status, the second the run
-- finished); retry_run inserts the -1 of the run it makes live again (a trigger on every status
-- change cost each settlement 2 us more, even when its WHEN was false). fold_stats (the
-- retention service) sums them (see the PostgreSQL schema). No trigger on INSERT: shoal inserts
-- no run final (rows inserted final by hand are not counted, nor a final run made live again
-- by hand). floor(x) is written as CAST(x AS INTEGER) - (x < CAST(x AS INTEGER)): SQLite's
-- floor() exists only where it was built with its math functions.

CREATE TABLE run_counts (
    namespace TEXT NOT NULL,
    workflow  TEXT NOT NULL,
    status    TEXT NOT NULL,
    bucket    INTEGER,          -- floor(finished_at); NULL: folded, ended two minutes ago or more
    n         INTEGER NOT NULL  -- runs counted (a delta: +1, -1, or a folded sum)
);

CREATE TRIGGER runs_uncounted AFTER DELETE ON runs
WHEN OLD.status IN ('succeeded', 'failed', 'cancelled')
BEGIN
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    VALUES (OLD.namespace, OLD.workflow, OLD.status,
            CAST(OLD.finished_at AS INTEGER)
            - (OLD.finished_at < CAST(OLD.finished_at AS INTEGER)), -1);
END;

-- the outbox, side effects recorded with the step that sent them (version 4) -----------------

CREATE TABLE outbox (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    seq          INTEGER NOT NULL,   -- the step that sent it
    idx          INTEGER NOT NULL,   -- its place among that step's entries
    topic        TEXT NOT NULL,
    payload      TEXT,
    created_at   REAL NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      REAL NOT NULL,      -- due then; a delivering instance holds it until then
    delivered_at REAL,
    dead         INTEGER NOT NULL DEFAULT 0,
    error        TEXT,
    trace_context TEXT,              -- its step's W3C trace context, JSON (version 22)
    UNIQUE (run_id, seq, idx)        -- invariant 3: a step's entries exist once
);
CREATE INDEX outbox_due ON outbox (namespace, next_at)
    WHERE delivered_at IS NULL AND dead = 0;
CREATE INDEX outbox_dead ON outbox (namespace, created_at, id) WHERE dead = 1;

-- coordination (shoal.coord.base): locks, membership, meters (version 6) ---------------------
-- Every key is scoped by the app's namespace.

-- invariant 7: a key has at most one holder with a live lease; tokens strictly increase. A row
-- outlives its holder (holder NULL) because it keeps the key's fencing counter.
CREATE TABLE locks (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    holder     TEXT,                         -- NULL: released (a lease that ended holds nothing)
    token      INTEGER NOT NULL DEFAULT 0,   -- the last fencing token granted on this key
    expires_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
-- The keys a holder holds: the console finds them without walking every key ever locked
-- (version 17).
CREATE INDEX locks_held ON locks (namespace, key) WHERE holder IS NOT NULL;

-- The FIFO queue of each key. A waiter of several keys has one row per key, all with its ticket.
CREATE TABLE lock_waiters (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    holder     TEXT NOT NULL,
    ticket     INTEGER NOT NULL,
    expires_at REAL NOT NULL,                -- a waiter that stops asking leaves the queue then
    PRIMARY KEY (namespace, key, holder)
) WITHOUT ROWID;
CREATE INDEX lock_waiters_queue ON lock_waiters (namespace, key, ticket);

-- The last ticket given in a namespace: tickets are ordered across keys.
CREATE TABLE lock_tickets (
    namespace TEXT PRIMARY KEY,
    ticket    INTEGER NOT NULL
) WITHOUT ROWID;

-- invariant 8: members heartbeat; a row ends at expires_at. held: the generation it acts on.
CREATE TABLE members (
    namespace  TEXT NOT NULL,
    member     TEXT NOT NULL,
    joined_at  REAL NOT NULL,
    expires_at REAL NOT NULL,
    held       INTEGER,
    beat_at    REAL,                         -- the latest heartbeat's now (version 17)
    version    TEXT,                         -- the member's code version (version 17)
    PRIMARY KEY (namespace, member)
) WITHOUT ROWID;

-- The roster (JSON array of sorted member ids) and its generation, one row per namespace.
CREATE TABLE rosters (
    namespace  TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    members    TEXT NOT NULL
) WITHOUT ROWID;

-- invariant 9: a debt in milliseconds per key, drained by the app's clock.
CREATE TABLE meters (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    debt       REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

-- rate-limit state (shoal.ports.RateStore): slots, sliding windows, pauses, counters and the
-- cost ledger (versions 7, 8, 10, 11). Every key is scoped by the app's namespace.
--
-- Retention (prune_coordination, prune_rates) deletes a bounded batch per poll. An index serves
-- it only where a prune would otherwise walk a table that grows with use: rate_window_entries_at
-- (a busy window holds about a window of entries per key, of many keys; the old ones of every key
-- are found from the oldest) and rate_counters_updated (one row per counter key ever used, the
-- idle ones found without walking the live ones). Meters, lock waiters, rate slots and rate
-- pauses need none: their prunes walk the namespace's rows through the primary key (meters: the
-- condition involves the debt) or they are purged per key by every acquire.

-- At most max_slots live holders per key: a row is a holder's slot until expires_at. Rows that
-- ended are deleted by the next slot_acquire of the key.
CREATE TABLE rate_slots (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, key, holder)
) WITHOUT ROWID;

-- A sliding window's entries: (at, amount). Entries that left the window (at <= now - window) are
-- deleted by the next window_add of the key, so a key keeps about one window of entries. The
-- leaving ones are found from the oldest, and a refused add walks them oldest first (ties in the
-- order they were added: the index ends with the rowid, which only grows).
CREATE TABLE rate_window_entries (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    at        REAL NOT NULL,
    amount    REAL NOT NULL
);
CREATE INDEX rate_window_entries_key ON rate_window_entries (namespace, key, at);
CREATE INDEX rate_window_entries_at ON rate_window_entries (namespace, at);

-- One row per window key: the sum of its entries, so that a window_add costs the entries leaving
-- the window, not the whole window. window_add subtracts the entries leaving and adds the one it
-- adds; the total is set to exactly 0 when no entry is left (no rounding drift outlives an empty
-- window); window_clear deletes the row with the entries.
CREATE TABLE rate_windows (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    total     REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

-- The time before which a key is paused (a later pause is kept).
CREATE TABLE rate_pauses (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    until     REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

-- Totals that only the caller resets (the spend behind budgets); updated_at is for pruning.
CREATE TABLE rate_counters (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    total      REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE INDEX rate_counters_updated ON rate_counters (namespace, updated_at);

-- The cost ledger: one row per spend added with its counters, in the order they were added. It
-- is read in pages, ledger(after=id), in id order, filtered by tenant, root or run: every read
-- walks the index of its narrowest filter from (namespace, ..., after), ending at the page's size
-- (cost_ledger_namespace: no filter; the primary key alone would walk every namespace's rows).
-- Ids are AUTOINCREMENT ids: they only grow and are never reused, even after rows are deleted,
-- and a transaction holds the file's write lock until it commits, so rows become visible in id
-- order.
CREATE TABLE cost_ledger (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    tenant    TEXT NOT NULL,
    run_id    TEXT,
    root_id   TEXT,
    amount    REAL NOT NULL,
    currency  TEXT NOT NULL,
    at        REAL NOT NULL,
    provider  TEXT,
    tokens    INTEGER
);
CREATE INDEX cost_ledger_tenant ON cost_ledger (namespace, tenant, id);
CREATE INDEX cost_ledger_root ON cost_ledger (namespace, root_id, id);
CREATE INDEX cost_ledger_namespace ON cost_ledger (namespace, id);
CREATE INDEX cost_ledger_run ON cost_ledger (namespace, run_id, id);

-- LangGraph checkpoints (version 20) ----------------------------------------------------------

CREATE TABLE graph_checkpoints (
    namespace      TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    checkpoint_id  TEXT NOT NULL,
    parent_id      TEXT,
    run_id         TEXT,
    type           TEXT NOT NULL,
    checkpoint     BLOB NOT NULL,
    metadata       TEXT NOT NULL,
    created_at     REAL NOT NULL,
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id)
) WITHOUT ROWID;
CREATE INDEX graph_checkpoints_run ON graph_checkpoints (namespace, tenant, run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE graph_writes (
    namespace      TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    checkpoint_id  TEXT NOT NULL,
    task_id        TEXT NOT NULL,
    idx            INTEGER NOT NULL,
    channel        TEXT NOT NULL,
    type           TEXT NOT NULL,
    value          BLOB NOT NULL,
    task_path      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;

-- The schema version: every migration this script holds, recorded as the store records one it
-- applies (shoal_migrations is the store's own table, created before this script runs).

INSERT INTO shoal_migrations (version, name, applied_at)
SELECT column1, column2, (julianday('now') - 2440587.5) * 86400.0
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
             (27, '0027_tenant_fairness.sql'));
