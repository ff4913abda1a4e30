-- shoal schema version 11: the cost ledger is read in pages, ledger(after=id), in id order, with
-- filters on tenant, root and run. Every read walks an index from (namespace, ..., after): the one
-- of its narrowest filter, the walk ending at the page's size. cost_ledger_tenant and
-- cost_ledger_root (version 7) serve tenant and root; these serve the rest:
--
-- - cost_ledger_namespace: the namespace's rows without a filter (the primary key alone would walk
--   the rows of every namespace);
-- - cost_ledger_run: one run's rows (a run is narrower than its root).
--
-- A page must never skip a row that commits later with a smaller id: counter_add takes an
-- advisory transaction lock of the namespace's ledger before its row takes its id from the
-- sequence, and holds it until it commits, so the rows of a namespace commit in id order (and a
-- reader that sees a row sees every row before it). Ids of different namespaces interleave.
CREATE INDEX cost_ledger_namespace ON cost_ledger (namespace, id);
CREATE INDEX cost_ledger_run ON cost_ledger (namespace, run_id, id);
