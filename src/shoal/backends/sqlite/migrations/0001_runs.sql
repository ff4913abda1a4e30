-- shoal schema version 1: runs, their step checkpoints, signals, and the workflow registry.
-- Times are seconds since the epoch from the app's Clock (REAL), never from SQLite.

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
    finished_at      REAL
);

-- invariant 5: one run per (tenant, workflow, idempotency key) in a namespace
CREATE UNIQUE INDEX runs_idempotency ON runs (namespace, tenant, workflow, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- the claim scan: only live rows are indexed, so its cost does not grow with finished runs
CREATE INDEX runs_queued ON runs (namespace, priority DESC, created_at, id)
    WHERE status = 'queued' AND held = 0;
CREATE INDEX runs_timed ON runs (namespace, run_at)
    WHERE status IN ('sleeping', 'waiting');
CREATE INDEX runs_claimed ON runs (namespace, status, lease_expires_at)
    WHERE status IN ('running', 'interrupted');
-- invariant 4, enforced by the database: a run holds its concurrency key from its first start
-- until it ends, and at most one run of a (workflow, key) holds it
CREATE UNIQUE INDEX runs_key_holder ON runs (namespace, workflow, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted');
CREATE INDEX runs_held ON runs (namespace, created_at, id) WHERE held = 1;
-- retention: finished runs are pruned oldest first
CREATE INDEX runs_finished ON runs (namespace, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX runs_namespace ON runs (namespace, id);

CREATE TABLE steps (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    name        TEXT NOT NULL,
    output      TEXT,
    finished    INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,   -- the lease epoch that wrote it
    finished_at REAL,
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
