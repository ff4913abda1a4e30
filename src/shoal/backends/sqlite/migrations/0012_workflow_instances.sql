-- shoal schema version 12: which instances serve each workflow (`shoal workflows`). Each start of
-- an instance records, per workflow it registers, the time of that registration; rows of a
-- namespace older than WORKFLOW_INSTANCE_RETENTION (shoal.stores.base) go at the next
-- registration in that namespace.
CREATE TABLE workflow_instances (
    namespace     TEXT NOT NULL,
    workflow      TEXT NOT NULL,
    instance      TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (namespace, workflow, instance)
) WITHOUT ROWID;
CREATE INDEX workflow_instances_registered ON workflow_instances (namespace, registered_at);
