-- shoal schema version 14: the counts of final runs that stats() reads, so that it never counts
-- the final rows themselves (a week of them under run_retention may be millions).
--
-- Whichever statement makes a run final, makes a final run live again (retry) or deletes it
-- (prune) inserts delta rows: +n or -n for (namespace, workflow, status, the second the runs
-- finished). Only inserts, never an update of a shared counter row: concurrent settlements never
-- wait for each other here (a counter row updated by every settlement would serialise the
-- workers). shoal's own statements insert theirs (one row per group of a batch: see
-- queries.sql); for any other session (shoal code older than this version still running beside
-- it during a rollout, a psql session), triggers insert one per run. fold_counts
-- (the retention service, every poll) sums a namespace's rows into one per (workflow, status,
-- second) for the last two minutes and one per (workflow, status) before (bucket NULL), so
-- stats reads a few rows per workflow and status.
--
-- The rows already final are counted here, after the triggers exist: CREATE TRIGGER locks the
-- runs table until this transaction commits, so no run ends between the count and the triggers.

CREATE TABLE run_counts (
    namespace text NOT NULL,
    workflow  text NOT NULL,
    status    text NOT NULL,
    bucket    bigint,           -- floor(finished_at); NULL: folded, ended two minutes ago or more
    n         bigint NOT NULL   -- runs counted (a delta: +1, -1, or a folded sum)
);
-- stats and fold_counts read a namespace's rows through it, never the whole table: a burst of
-- settlements leaves the table long (the folded rows are inserted at its end, so VACUUM cannot
-- cut it short), and other namespaces may share it.
CREATE INDEX run_counts_namespace ON run_counts (namespace);

CREATE FUNCTION runs_counted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status
       AND OLD.finished_at IS NOT DISTINCT FROM NEW.finished_at THEN
        RETURN NULL;
    END IF;
    IF OLD.status IN ('succeeded', 'failed', 'cancelled') THEN
        INSERT INTO run_counts (namespace, workflow, status, bucket, n)
        VALUES (OLD.namespace, OLD.workflow, OLD.status, floor(OLD.finished_at), -1);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        INSERT INTO run_counts (namespace, workflow, status, bucket, n)
        VALUES (NEW.namespace, NEW.workflow, NEW.status, floor(NEW.finished_at), 1);
    END IF;
    RETURN NULL;
END
$$;

-- Only for sessions that do not count themselves: shoal's own connections set shoal.counted to
-- 'on', and their statements insert one row per (namespace, workflow, status, second) of a
-- batch instead of one per run (this function, run by run, cost a settlement a quarter more
-- server time). The WHEN condition is all a statement of shoal's pays: checked once per row,
-- compiled once per statement (about 3 us: a longer one, 8 us); the function sorts out the rest.
-- No trigger on INSERT: shoal inserts no run final, and one with a false WHEN still cost each
-- dispatch about 7 us. Rows inserted final by hand are not counted (write through shoal).
CREATE TRIGGER runs_recounted AFTER UPDATE OF status, finished_at ON runs
FOR EACH ROW
WHEN (current_setting('shoal.counted', true) IS DISTINCT FROM 'on')
EXECUTE FUNCTION runs_counted();

CREATE TRIGGER runs_uncounted AFTER DELETE ON runs
FOR EACH ROW
WHEN (current_setting('shoal.counted', true) IS DISTINCT FROM 'on')
EXECUTE FUNCTION runs_counted();

-- The runs already final, by the second they finished for the last two minutes before the
-- newest of their namespace (about the app's now), folded before.
WITH latest AS (
    SELECT namespace, max(finished_at) AS at FROM runs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
    GROUP BY namespace
)
INSERT INTO run_counts (namespace, workflow, status, bucket, n)
SELECT r.namespace, r.workflow, r.status,
       CASE WHEN r.finished_at >= floor(l.at) - 120 THEN floor(r.finished_at) END, count(*)
FROM runs r JOIN latest l ON l.namespace = r.namespace
WHERE r.status IN ('succeeded', 'failed', 'cancelled')
GROUP BY 1, 2, 3, 4;
