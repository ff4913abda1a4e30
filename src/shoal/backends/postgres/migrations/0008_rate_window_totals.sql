-- shoal schema version 8: a sliding window's running total beside its entries, so that a
-- window_add costs the entries leaving the window, not the whole window (a provider at 10k
-- requests a minute holds 10k entries). The same table as SQLite's.
--
-- The entries get "seq", the order they were added in: entries of the same time are walked in
-- that order by a refused add (as the memory reference keeps them), so the index on
-- (namespace, key, at) becomes (namespace, key, at, seq): the leaving entries are still found
-- from the oldest, and the walk reads the index in order without a sort.
ALTER TABLE rate_window_entries ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
DROP INDEX rate_window_entries_key;
CREATE INDEX rate_window_entries_key ON rate_window_entries (namespace, key, at, seq);

-- One row per window key: the sum of its entries. window_add (after the key's advisory lock)
-- subtracts the entries leaving and adds the one it adds; the total is set to exactly 0 when no
-- entry is left (no rounding drift outlives an empty window); window_clear deletes the row with
-- the entries.
CREATE TABLE rate_windows (
    namespace text NOT NULL,
    key       text NOT NULL,
    total     double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- The totals of the entries already there (entries that left are subtracted by the next add).
INSERT INTO rate_windows (namespace, key, total)
SELECT namespace, key, sum(amount) FROM rate_window_entries GROUP BY namespace, key;
