-- shoal schema version 23: runs_namespace is dropped, so a run's life writes fewer index entries.
--
-- No update of a run is HOT (its status, in the partial indexes' conditions, changes every time),
-- so every index without a condition gets an entry for each version of the row: at the dispatch,
-- the claim and the settlement. runs_namespace (namespace, id) was such an index: three of the nine
-- index entries of a run that runs once, a quarter of the server's time per run. What read it now
-- walks the primary key (ids are time-ordered) and checks the namespace on the rows: the listing of
-- a namespace's runs newest first (search_runs, list_runs) and nothing on a hot path. A table that
-- many apps' namespaces share lists a small namespace by walking the others' newer runs too: give
-- each app a schema of its own (?schema=) where that matters.

DROP INDEX runs_namespace;
