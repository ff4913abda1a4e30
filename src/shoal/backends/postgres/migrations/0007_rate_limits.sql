-- shoal schema version 7: rate-limit state (shoal.ports.RateStore): slots, sliding windows,
-- pauses, counters and the cost ledger. The same tables and columns as SQLite's. Every key is
-- scoped by the app's namespace. Times are the app's clock (double precision), never the server's.
--
-- Concurrency (shoal.stores.postgres_rate): the operations on one slot key, or on one window key,
-- are serialized by an advisory transaction lock of that key (its rows come and go, so there may
-- be no row to lock); counter rows are locked in "C" order, created first if missing, and never
-- deleted; a pause is one upsert.

-- At most max_slots live holders per key: a row is a holder's slot until expires_at. Rows that
-- ended are deleted by the next slot_acquire of the key.
CREATE TABLE rate_slots (
    namespace  text NOT NULL,
    key        text NOT NULL,
    holder     text NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (namespace, key, holder)
);

-- A sliding window's entries: (at, amount). Entries that left the window (at <= now - window) are
-- deleted by the next window_add of the key, so a key keeps about one window of entries.
CREATE TABLE rate_window_entries (
    namespace text NOT NULL,
    key       text NOT NULL,
    at        double precision NOT NULL,
    amount    double precision NOT NULL
);
CREATE INDEX rate_window_entries_key ON rate_window_entries (namespace, key, at);

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

-- The cost ledger: one row per spend added with its counters. Oldest first is id order: a row is
-- written while its counter rows are locked, so rows of spends on shared counters commit in id
-- order (rows of unrelated spends may commit out of id order; nothing waits on that order).
CREATE TABLE cost_ledger (
    id        bigserial PRIMARY KEY,
    namespace text NOT NULL,
    tenant    text NOT NULL,
    run_id    text,
    root_id   text,
    amount    double precision NOT NULL,
    currency  text NOT NULL,
    at        double precision NOT NULL
);
CREATE INDEX cost_ledger_tenant ON cost_ledger (namespace, tenant, id);
CREATE INDEX cost_ledger_root ON cost_ledger (namespace, root_id, id);
