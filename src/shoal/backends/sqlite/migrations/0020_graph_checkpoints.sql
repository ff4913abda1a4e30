-- shoal schema version 20: LangGraph checkpoints (shoal.integrations.langgraph.ShoalCheckpointer).
--
-- A checkpoint of a LangGraph thread, by namespace and tenant (two tenants' threads never meet),
-- thread, checkpoint namespace (a subgraph's) and id (LangGraph's uuid6: the greatest is the
-- latest). ``type`` and ``checkpoint`` are the serializer's output, channel values included;
-- ``metadata`` is JSON (``list`` filters on it); ``run_id`` is the LangGraph run id of the
-- metadata (``delete_for_runs``). A graph run by run_graph has the shoal run's id as thread.
-- graph_writes holds the pending writes of a checkpoint's tasks, one per (task_id, idx).

CREATE TABLE graph_checkpoints (
    namespace      TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    checkpoint_id  TEXT NOT NULL,
    parent_id      TEXT,
    run_id         TEXT,
    type           TEXT NOT NULL,
    checkpoint     BLOB NOT NULL,
    metadata       TEXT NOT NULL,
    created_at     REAL NOT NULL,
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id)
) WITHOUT ROWID;
CREATE INDEX graph_checkpoints_run ON graph_checkpoints (namespace, tenant, run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE graph_writes (
    namespace      TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    checkpoint_id  TEXT NOT NULL,
    task_id        TEXT NOT NULL,
    idx            INTEGER NOT NULL,
    channel        TEXT NOT NULL,
    type           TEXT NOT NULL,
    value          BLOB NOT NULL,
    task_path      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;
