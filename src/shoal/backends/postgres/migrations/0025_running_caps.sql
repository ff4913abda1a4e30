-- shoal schema version 25: max_running and max_running_per_tenant.
--
-- The claim of a workflow with a running cap counts its runs in `running` (of each tenant, for
-- max_running_per_tenant) in the same transaction that claims: runs_running makes that count a
-- walk of the workflow's running runs only, however many other runs are running.

CREATE INDEX runs_running ON runs (namespace, workflow, tenant) WHERE status = 'running';
