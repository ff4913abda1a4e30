"""The workflows each instance serves (:class:`shoal.ports.WorkflowRegistry`) in the PostgreSQL
store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal import _json
from shoal.backends.postgres.connections import Connections, Q
from shoal.types import JSON, WORKFLOW_INSTANCE_RETENTION, PausedWorkflow, WorkflowInfo


class PostgresWorkflows:
    """The registered workflows, the instances serving them, the paused ones and the tenant
    weights, on ``db``."""

    def __init__(self, db: Connections, channel: str) -> None:
        self.db = db
        self.channel = channel   # a resume announces itself there

    async def register_workflows(
        self, namespace: str, workflows: Mapping[str, JSON], now: float,
        instance: str | None = None,
    ) -> None:
        if not workflows:
            return
        # in name order: two instances registering at once lock the rows in one order
        names = sorted(workflows)
        args = {"namespace": namespace, "names": names, "now": now, "instance": instance,
                "options": [_json.dumps(workflows[n]) for n in names],
                "before": now - WORKFLOW_INSTANCE_RETENTION}

        async def register() -> None:
            async with self.db.connection() as conn, self.db.transaction(conn):
                await conn.execute(Q["register_workflows"], args)
                if instance is not None:
                    await conn.execute(Q["register_workflow_instances"], args)
                    await conn.execute(Q["forget_workflow_instances"], args)

        await self.db.retry(register)

    async def get_workflow(self, namespace: str, name: str) -> JSON:
        row = await self.db.one(Q["get_workflow"], {"namespace": namespace, "name": name})
        return None if row is None else _json.loads(row["options"])

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]:
        args = {"namespace": namespace}
        served: dict[tuple[str, str], list[tuple[str, float]]] = {}
        for row in await self.db.all(Q["list_workflow_instances"], args):
            served.setdefault((row["namespace"], row["workflow"]), []).append(
                (row["instance"], row["registered_at"]))
        return [WorkflowInfo(row["namespace"], row["name"], _json.loads(row["options"]),
                             row["registered_at"],
                             tuple(served.get((row["namespace"], row["name"]), ())))
                for row in await self.db.all(Q["list_workflows"], args)]

    async def pause_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        args = _paused(namespace, workflow, tenant, now)
        return await self.db.retry(lambda: self.db.one(Q["pause_workflow"], args)) is not None

    async def resume_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        args = {**_paused(namespace, workflow, tenant, now), "channel": self.channel}
        return await self.db.retry(lambda: self.db.one(Q["resume_workflow"], args)) is not None

    async def paused_workflows(self, namespace: str) -> list[PausedWorkflow]:
        rows = await self.db.all(Q["paused_workflows"], {"namespace": namespace})
        return [PausedWorkflow(row["workflow"], row["tenant"] or None, row["paused_at"])
                for row in rows]

    async def set_tenant_weight(self, namespace: str, tenant: str, weight: float) -> None:
        args = {"namespace": namespace, "tenant": tenant, "weight": float(weight)}
        query = Q["clear_tenant_weight" if weight == 1 else "set_tenant_weight"]
        await self.db.retry(lambda: self.db.all(query, args, fetch=False))

    async def tenant_weights(self, namespace: str) -> dict[str, float]:
        rows = await self.db.all(Q["tenant_weights"], {"namespace": namespace})
        return {row["tenant"]: row["weight"] for row in rows}



def _paused(namespace: str, workflow: str, tenant: str | None, now: float) -> dict[str, Any]:
    """The arguments of the paused_workflows statements ('' stands for every tenant)."""
    return {"namespace": namespace, "workflow": workflow, "tenant": tenant or "", "now": now}
