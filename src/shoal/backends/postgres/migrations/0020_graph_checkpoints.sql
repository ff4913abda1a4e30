-- shoal schema version 20: LangGraph checkpoints (shoal.integrations.langgraph.ShoalCheckpointer).
--
-- A checkpoint of a LangGraph thread, by namespace and tenant (two tenants' threads never meet),
-- thread, checkpoint namespace (a subgraph's) and id (LangGraph's uuid6: the greatest is the
-- latest). ``type`` and ``checkpoint`` are the serializer's output, channel values included;
-- ``metadata`` is JSON (``list`` filters on it); ``run_id`` is the LangGraph run id of the
-- metadata (``delete_for_runs``). A graph run by run_graph has the shoal run's id as thread.
-- graph_writes holds the pending writes of a checkpoint's tasks, one per (task_id, idx).

CREATE TABLE graph_checkpoints (
    namespace      text NOT NULL,
    tenant         text NOT NULL,
    thread_id      text NOT NULL,
    checkpoint_ns  text NOT NULL,
    checkpoint_id  text COLLATE "C" NOT NULL,
    parent_id      text,
    run_id         text,
    type           text NOT NULL,
    checkpoint     bytea NOT NULL,
    metadata       jsonb NOT NULL,
    created_at     double precision NOT NULL,
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX graph_checkpoints_run ON graph_checkpoints (namespace, tenant, run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE graph_writes (
    namespace      text NOT NULL,
    tenant         text NOT NULL,
    thread_id      text NOT NULL,
    checkpoint_ns  text NOT NULL,
    checkpoint_id  text COLLATE "C" NOT NULL,
    task_id        text NOT NULL,
    idx            integer NOT NULL,
    channel        text NOT NULL,
    type           text NOT NULL,
    value          bytea NOT NULL,
    task_path      text NOT NULL DEFAULT '',
    PRIMARY KEY (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
