-- shoal schema version 11: the cost ledger is read in pages, ledger(after=id), in id order, with
-- filters on tenant, root and run. Every read walks an index from (namespace, ..., after): the one
-- of its narrowest filter, the walk ending at the page's size. cost_ledger_tenant and
-- cost_ledger_root (version 7) serve tenant and root; these serve the rest:
--
-- - cost_ledger_namespace: the namespace's rows without a filter (the primary key alone would walk
--   the rows of every namespace);
-- - cost_ledger_run: one run's rows (a run is narrower than its root).
--
-- Ids are the rows' AUTOINCREMENT ids: they only grow and are never reused, even after rows are
-- deleted, and a transaction holds the file's write lock until it commits, so rows become visible
-- in id order.
CREATE INDEX cost_ledger_namespace ON cost_ledger (namespace, id);
CREATE INDEX cost_ledger_run ON cost_ledger (namespace, run_id, id);
