-- shoal schema version 3: run trees (child runs, request-wide state). The same table as SQLite's;
-- times are the app's Clock (double precision) and JSON values are kept as their text.

CREATE TABLE tree_keys (
    root_id    text NOT NULL,
    key        text NOT NULL,
    value      text,
    claimant   text NOT NULL,     -- the step that stored it (a re-executed step gets True again)
    created_at double precision NOT NULL,
    PRIMARY KEY (root_id, key)
);

-- the unfinished runs of a tree, which cancelling its root cancels
CREATE INDEX runs_children ON runs (root_id) WHERE id <> root_id;

-- Whichever statement ends a run (a settlement, recovery, a cancellation): a parent waiting for it
-- becomes due at once, and a root drops its tree's keys. The wake-up notifies the store's channel,
-- 'shoal_' followed by the schema's name (PostgresStore.channel): the table's own schema is the
-- store's, so the trigger needs nothing from the statement that fired it. The function's
-- search_path is the schema it was created in (FROM CURRENT: the migration runs with the store's
-- schema as search_path), so it finds its tables whatever the session's search_path is.
-- VOLATILE (the default), so each statement sees what concurrent transactions have committed
-- since the firing statement began: a parent that wait_child parked after locking the child is
-- seen waiting once the child's row lock is granted.
CREATE FUNCTION runs_ended() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.parent_id IS NOT NULL THEN
        UPDATE runs SET run_at = NEW.finished_at
        WHERE id = NEW.parent_id AND status = 'waiting' AND wait_for = 'shoal.child:' || NEW.id;
        IF FOUND THEN
            PERFORM pg_notify('shoal_' || TG_TABLE_SCHEMA, '');
        END IF;
    END IF;
    IF NEW.id = NEW.root_id THEN
        DELETE FROM tree_keys WHERE root_id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_ended AFTER UPDATE OF status ON runs
FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled')
      AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled'))
EXECUTE FUNCTION runs_ended();
