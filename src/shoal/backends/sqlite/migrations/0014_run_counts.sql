-- shoal schema version 14: the counts of final runs that stats() reads, so that it never counts
-- the final rows themselves (a week of them under run_retention may be millions). The same table
-- as PostgreSQL's (see its migration 0014): whichever statement makes a run final or deletes it
-- (prune), a trigger inserts a delta row (+1 or -1) for (namespace, workflow, status, the second
-- the run finished), and retry_run the -1 of a run it makes live again; fold_stats (the retention
-- service) sums them. No trigger on INSERT: shoal inserts no run final (rows inserted final by
-- hand are not counted). The rows already final are counted here, in the migration's
-- transaction. floor(x) is written as CAST(x AS INTEGER) - (x < CAST(x AS INTEGER)): SQLite's
-- floor() exists only where it was built with its math functions.

CREATE TABLE run_counts (
    namespace TEXT NOT NULL,
    workflow  TEXT NOT NULL,
    status    TEXT NOT NULL,
    bucket    INTEGER,          -- floor(finished_at); NULL: folded, ended two minutes ago or more
    n         INTEGER NOT NULL  -- runs counted (a delta: +1, -1, or a folded sum)
);

-- runs_ended (version 3) counts the runs it sees end: here rather than in a trigger of its own,
-- which cost each settlement 5 us more.
DROP TRIGGER runs_ended;
CREATE TRIGGER runs_ended AFTER UPDATE OF status ON runs
WHEN NEW.status IN ('succeeded', 'failed', 'cancelled')
 AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled')
BEGIN
    UPDATE runs SET run_at = NEW.finished_at
    WHERE NEW.parent_id IS NOT NULL AND id = NEW.parent_id AND status = 'waiting'
      AND wait_for = 'shoal.child:' || NEW.id;
    DELETE FROM tree_keys WHERE NEW.id = NEW.root_id AND root_id = NEW.id;
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    VALUES (NEW.namespace, NEW.workflow, NEW.status,
            CAST(NEW.finished_at AS INTEGER)
            - (NEW.finished_at < CAST(NEW.finished_at AS INTEGER)), 1);
END;

CREATE TRIGGER runs_uncounted AFTER DELETE ON runs
WHEN OLD.status IN ('succeeded', 'failed', 'cancelled')
BEGIN
    INSERT INTO run_counts (namespace, workflow, status, bucket, n)
    VALUES (OLD.namespace, OLD.workflow, OLD.status,
            CAST(OLD.finished_at AS INTEGER)
            - (OLD.finished_at < CAST(OLD.finished_at AS INTEGER)), -1);
END;

-- The runs already final, by the second they finished for the last two minutes before the
-- newest of their namespace (about the app's now), folded before.
INSERT INTO run_counts (namespace, workflow, status, bucket, n)
SELECT r.namespace, r.workflow, r.status,
       CASE WHEN r.finished_at >= l.first
            THEN CAST(r.finished_at AS INTEGER)
                 - (r.finished_at < CAST(r.finished_at AS INTEGER)) END AS bucket,
       count(*)
FROM runs r
JOIN (SELECT namespace,
             CAST(max(finished_at) AS INTEGER)
             - (max(finished_at) < CAST(max(finished_at) AS INTEGER)) - 120 AS first
      FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled')
      GROUP BY namespace) l ON l.namespace = r.namespace
WHERE r.status IN ('succeeded', 'failed', 'cancelled')
GROUP BY r.namespace, r.workflow, r.status, bucket;
