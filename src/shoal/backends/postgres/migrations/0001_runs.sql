-- shoal schema version 1: runs, their step checkpoints, signals, and the workflow registry.
-- Applied inside the store's own schema (search_path). The same tables and columns as SQLite's.
-- Times are seconds since the epoch from the app's Clock (double precision), never from the server.
-- JSON values are kept as their text (as on SQLite), so key order, numbers and escapes come back
-- exactly as they were written.

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
    finished_at      double precision
);

-- invariant 5: one run per (tenant, workflow, idempotency key) in a namespace
CREATE UNIQUE INDEX runs_idempotency ON runs (namespace, tenant, workflow, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- invariant 4, enforced by the database: a started, unfinished run holds its concurrency key, and
-- a claim sets started_at, so two concurrent claims of one key cannot both commit.
CREATE UNIQUE INDEX runs_key_holder ON runs (namespace, workflow, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND started_at IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted');
-- the first due run of a free key is the only one of that key a claim may take
CREATE INDEX runs_key_queued ON runs (namespace, workflow, concurrency_key, priority DESC,
                                      created_at, id)
    WHERE concurrency_key IS NOT NULL AND status = 'queued' AND started_at IS NULL AND NOT held;
-- the claim scan: only live rows are indexed, so its cost does not grow with finished runs
CREATE INDEX runs_queued ON runs (namespace, priority DESC, created_at, id)
    WHERE status = 'queued' AND NOT held;
CREATE INDEX runs_timed ON runs (namespace, run_at)
    WHERE status IN ('sleeping', 'waiting');
CREATE INDEX runs_claimed ON runs (namespace, status, lease_expires_at)
    WHERE status IN ('running', 'interrupted');
CREATE INDEX runs_held ON runs (namespace, created_at, id) WHERE held;
CREATE INDEX runs_namespace ON runs (namespace, id);
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
