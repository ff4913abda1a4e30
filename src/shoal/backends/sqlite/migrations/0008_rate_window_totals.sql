-- shoal schema version 8: a sliding window's running total beside its entries, so that a
-- window_add costs the entries leaving the window, not the whole window (a provider at 10k
-- requests a minute holds 10k entries). The entries and their index (namespace, key, at) stay:
-- the leaving ones are found from the oldest, and a refused add walks them oldest first (ties in
-- the order they were added: the index ends with the rowid, which only grows).

-- One row per window key: the sum of its entries. window_add subtracts the entries leaving and adds
-- the one it adds; the total is set to exactly 0 when no entry is left (no rounding drift outlives
-- an empty window); window_clear deletes the row with the entries.
CREATE TABLE rate_windows (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    total     REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

-- The totals of the entries already there (entries that left are subtracted by the next add).
INSERT INTO rate_windows (namespace, key, total)
SELECT namespace, key, sum(amount) FROM rate_window_entries GROUP BY namespace, key;
