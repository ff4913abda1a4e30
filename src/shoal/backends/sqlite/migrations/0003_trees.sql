-- shoal schema version 3: run trees (child runs, request-wide state).

CREATE TABLE tree_keys (
    root_id    TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT,
    claimant   TEXT NOT NULL,     -- the step that stored it (a re-executed step gets True again)
    created_at REAL NOT NULL,
    PRIMARY KEY (root_id, key)
) WITHOUT ROWID;

CREATE INDEX runs_children ON runs (root_id) WHERE id <> root_id;

-- Whichever statement ends a run (settle, recovery, cancel): a parent waiting for it becomes
-- due at once, and a root drops its tree's keys.
CREATE TRIGGER runs_ended AFTER UPDATE OF status ON runs
WHEN NEW.status IN ('succeeded', 'failed', 'cancelled')
 AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled')
BEGIN
    UPDATE runs SET run_at = NEW.finished_at
    WHERE NEW.parent_id IS NOT NULL AND id = NEW.parent_id AND status = 'waiting'
      AND wait_for = 'shoal.child:' || NEW.id;
    DELETE FROM tree_keys WHERE NEW.id = NEW.root_id AND root_id = NEW.id;
END;
