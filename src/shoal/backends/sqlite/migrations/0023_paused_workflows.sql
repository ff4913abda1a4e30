-- shoal schema version 23: paused workflows (app.pause_workflow, shoal workflow pause).
--
-- One row per pause: no run of the workflow in the namespace starts while the row is here, of
-- every tenant when its tenant is '', else of that tenant only. The claims read it as one probe of the primary
-- key per candidate run (NOT EXISTS), so an empty table costs the claim next to nothing.

CREATE TABLE paused_workflows (
    namespace TEXT NOT NULL,
    workflow  TEXT NOT NULL,
    tenant    TEXT NOT NULL,      -- '' for every tenant
    paused_at REAL NOT NULL,
    PRIMARY KEY (namespace, workflow, tenant)
) WITHOUT ROWID;
