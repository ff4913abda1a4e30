-- shoal schema version 7: rate-limit state (shoal.ports.RateStore): slots, sliding windows,
-- pauses, counters and the cost ledger. Every key is scoped by the app's namespace. Times are the
-- app's clock (REAL), never SQLite's.

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
-- deleted by the next window_add of the key, so a key keeps about one window of entries.
CREATE TABLE rate_window_entries (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    at        REAL NOT NULL,
    amount    REAL NOT NULL
);
CREATE INDEX rate_window_entries_key ON rate_window_entries (namespace, key, at);

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

-- The cost ledger: one row per spend added with its counters, in the order they were added.
CREATE TABLE cost_ledger (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    tenant    TEXT NOT NULL,
    run_id    TEXT,
    root_id   TEXT,
    amount    REAL NOT NULL,
    currency  TEXT NOT NULL,
    at        REAL NOT NULL
);
CREATE INDEX cost_ledger_tenant ON cost_ledger (namespace, tenant, id);
CREATE INDEX cost_ledger_root ON cost_ledger (namespace, root_id, id);
