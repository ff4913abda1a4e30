-- shoal schema version 25: max_running and max_running_per_tenant.
--
-- The claim of a workflow with a running cap counts its runs in `running` (of each tenant, for
-- max_running_per_tenant) in the same transaction that claims, through runs_claimed (the
-- running and interrupted runs of a namespace): no index of its own, so that a run of a
-- workflow without a cap writes no more index entries than before. Development builds of this
-- version created an index runs_running, dropped here.

DROP INDEX IF EXISTS runs_running;
