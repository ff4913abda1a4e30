-- shoal schema version 16: a root run records that its tree has keys, so that the runs_ended
-- trigger fires only for the runs that need it: a child (its parent may be waiting for it) or a
-- root whose tree stored keys (they are dropped with it). For every other run, most of them, the
-- trigger's WHEN is all a settlement pays: the plpgsql call and the probe of tree_keys cost a
-- settlement about 5 us of server time, a fifth of the whole.
--
-- insert_tree_key sets the flag in the statement that inserts a key, on the root's row, which it
-- updates (and so locks) only while the root is unfinished: a statement ending the root waits
-- for it, then sees the flag and drops the key with the rest.
--
-- During a rollout, shoal code older than this version inserts keys without setting the flag;
-- those keys stay after their root ends, unseen by any run of another tree, until retention
-- prunes the root (prune_runs drops a pruned root's keys).

ALTER TABLE runs ADD COLUMN has_tree_keys boolean NOT NULL DEFAULT false;

UPDATE runs SET has_tree_keys = true
WHERE id IN (SELECT root_id FROM tree_keys);

DROP TRIGGER runs_ended ON runs;
CREATE TRIGGER runs_ended AFTER UPDATE OF status ON runs
FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled')
      AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled')
      AND (NEW.parent_id IS NOT NULL OR NEW.has_tree_keys))
EXECUTE FUNCTION runs_ended();
