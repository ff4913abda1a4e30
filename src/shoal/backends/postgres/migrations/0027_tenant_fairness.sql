-- shoal schema version 27: fairness between tenants (fairness="tenant", app.set_tenant_weight).
--
-- tenant_weights: a tenant's weight in its namespace under fairness="tenant" (no row: 1), read
-- by the claim of every replica. runs_fair_queued: the queued runs of a workflow by tenant, so
-- that a claim finds the tenants with queued runs one index probe each (a recursive skip scan)
-- and each tenant's first runs in claim order, however long another tenant's backlog is.

CREATE TABLE tenant_weights (
    namespace text NOT NULL,
    tenant    text NOT NULL,
    weight    double precision NOT NULL CHECK (weight > 0),
    PRIMARY KEY (namespace, tenant)
);
CREATE INDEX runs_fair_queued ON runs (namespace, workflow, tenant, priority DESC, created_at, id)
    WHERE status = 'queued' AND NOT held;
