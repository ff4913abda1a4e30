-- shoal schema version 10: retention of coordination and rate-limit state (prune_coordination,
-- prune_rates), a bounded batch per poll. An index is added only where a prune would otherwise
-- walk a table that grows with use:
--
-- - rate_window_entries: a busy window holds about a window of entries per key (10k at 10k
--   requests a minute), and the entries of many keys; (namespace, at) finds the old ones of every
--   key from the oldest (ties in the order they were added, seq), the walk ending at the
--   batch's size.
-- - rate_counters: one row per counter key ever used (budgets per tenant and period), rewritten
--   only by spends; (namespace, updated_at) finds the idle ones without walking the live ones.
--
-- No index for the others: meters (one row per metered key, drained meters are the ones pruned:
-- the condition involves the debt, so no index on updated_at would decide it; the walk is the
-- namespace's meters through the primary key, ending at the batch's size), lock waiters and rate
-- slots (rows of live waiters and holders, purged per key by every acquire), rate pauses (one row
-- per paused key).
CREATE INDEX rate_window_entries_at ON rate_window_entries (namespace, at, seq);
CREATE INDEX rate_counters_updated ON rate_counters (namespace, updated_at);
