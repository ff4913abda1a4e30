-- shoal schema version 9: a tree key carries its tenant (every run, pause, tree key, ledger row
-- and limiter key does), the tenant of its tree's root run. insert_tree_key takes it from the
-- root's row in the statement that stores the key. SQLite adds a NOT NULL column only with a
-- default: 'default', which is also what a key whose root run is gone gets here.
ALTER TABLE tree_keys ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';

-- The keys already there: their root's tenant.
UPDATE tree_keys
SET tenant = (SELECT tenant FROM runs WHERE runs.id = tree_keys.root_id)
WHERE EXISTS (SELECT 1 FROM runs WHERE runs.id = tree_keys.root_id);
