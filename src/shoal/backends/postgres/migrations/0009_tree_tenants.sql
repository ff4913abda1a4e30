-- shoal schema version 9: a tree key carries its tenant (every run, pause, tree key, ledger row
-- and limiter key does), the tenant of its tree's root run. The same column as SQLite's:
-- insert_tree_key takes it from the root's row in the statement that stores the key; the default
-- 'default' is what a key whose root run is gone gets here (a constant default: adding the column
-- rewrites no row).
ALTER TABLE tree_keys ADD COLUMN tenant text NOT NULL DEFAULT 'default';

-- The keys already there: their root's tenant.
UPDATE tree_keys SET tenant = runs.tenant
FROM runs
WHERE runs.id = tree_keys.root_id;
