"""The store contracts: the behaviour every backend must show, one suite per concern of
:mod:`shoal.ports`, for shoal's own backends and for yours.

- :class:`RunContract`: the run queue, the workflow registry, checkpoints, sleeps and signals,
  admission and retention (fixtures ``store`` and ``other``);
- :class:`PauseContract`: pauses (approvals) and their notifications (``store``, ``other``);
- :class:`TreeContract`: tree keys, child runs, a root's cancel (``store``, ``other``);
- :class:`OutboxContract`: the outbox (``store``, ``other``);
- :class:`StatsContract`: a namespace's stats and their fold (``store``, ``other``);
- :class:`InspectionContract`: what a console reads, and the redrive of a dead letter
  (``store``, ``other``);
- :class:`ProgressContract`: a run's progress, the latest value only, fenced (``store``,
  ``other``);
- :class:`ConcurrencyLimitContract`: up to N runs of a concurrency key at once, the claimer's
  ``concurrency_limits`` (``store``, ``other``);
- :class:`PausedWorkflowContract`: paused workflows, whose runs no claim starts (``store``,
  ``other``);
- :class:`RunningCapContract`: at most ``max_running`` runs of a workflow (of a tenant:
  ``max_running_per_tenant``) in ``running`` at once, the claimer's ``flow`` (``store``,
  ``other``);
- :class:`FlowViewContract`: which flow-control rule holds back queued runs, and one run
  (``store``, ``other``);
- :class:`RateLimitContract`: at most N first starts of a workflow and rate key per window,
  the claimer's ``flow`` (``store``, ``other``);
- :class:`FlowRulesTogetherContract`: flow rules together, on one workflow and on workflows
  served by one claim (``store``, ``other``);
- :class:`FairnessContract`: ``fairness="tenant"``, tenants taking turns in the claim, and
  the stored tenant weights (``store``, ``other``);
- :class:`StoreContract`: the fourteen above, a whole :class:`~shoal.ports.Store`;
- :class:`CoordContract`: locks, membership and meters, a :class:`~shoal.ports.CoordStore`
  (``coord``, ``other``);
- :class:`RateContract`: rate limits and the ledger, a :class:`~shoal.ports.RateStore`
  (``rates``, ``other``);
- :class:`TransactionalContract`: runs dispatched in the caller's own transaction, a
  :class:`~shoal.ports.TransactionalDispatch` (``store``, ``other``, and factories of the
  caller's transactions ``caller`` and ``stranger``: see its module);
- :class:`RunDifferential`, :class:`CoordDifferential`, :class:`RateDifferential`: seeded random
  calls that must get the answers the memory reference gives (``store``, ``coord``, ``rates``;
  :mod:`shoal.testing.contract.differential`, whose generators can also be called directly).

Subclass the suites your backend implements in a pytest module and provide their fixtures as
async fixtures: the store (``store``, ``coord`` or ``rates``), opened and empty, and ``other``, a
second opened handle to the *same* data (another connection to the same file or database; for an
in-process store, the same object)::

    import pytest
    from shoal.testing.contract import RunDifferential, StoreContract

    class TestMyStore(StoreContract, RunDifferential):
        @pytest.fixture
        async def store(self, tmp_path):
            s = MyStore(tmp_path / "db")
            await s.open()
            yield s
            await s.close()

        @pytest.fixture
        async def other(self, store):
            s = MyStore(store.path)
            await s.open()
            yield s
            await s.close()

Every time is passed as ``now``: the suites need no clock. They need pytest and pytest-asyncio
(``asyncio_mode = "auto"``); ``pytest.register_assert_rewrite("shoal.testing.contract")`` in your
``conftest.py`` (before the import) makes their failures show the values compared. A suite imports
:mod:`shoal.types`, :mod:`shoal.ports` and :mod:`shoal.errors` (a differential one also the
memory backend, its reference), never an app or the engine: a backend is held to the ports, not
to how shoal happens to call them. The helpers the suites build
their records with (``new_run``, ``add``, ``claim``, ``fence``, ``T0``, ``NS``, ``LEASE``...) are
:mod:`.support`'s.
"""

from __future__ import annotations

from shoal.testing.contract.caps import RunningCapContract
from shoal.testing.contract.coordination import CoordContract
from shoal.testing.contract.differential import (
    CoordDifferential,
    RateDifferential,
    RunDifferential,
    coord_calls,
    rate_calls,
    rate_calls_apart,
    run_calls,
)
from shoal.testing.contract.fairness import FairnessContract
from shoal.testing.contract.flowmix import FlowRulesTogetherContract
from shoal.testing.contract.flowrates import RateLimitContract
from shoal.testing.contract.heldback import FlowViewContract
from shoal.testing.contract.inspection import InspectionContract
from shoal.testing.contract.limits import ConcurrencyLimitContract
from shoal.testing.contract.outbox import OutboxContract
from shoal.testing.contract.paused import PausedWorkflowContract
from shoal.testing.contract.pauses import PauseContract
from shoal.testing.contract.progress import ProgressContract
from shoal.testing.contract.rates import RateContract
from shoal.testing.contract.runs import RunContract
from shoal.testing.contract.stats import StatsContract
from shoal.testing.contract.support import (
    APPROVED,
    LEASE,
    NS,
    T0,
    add,
    claim,
    entries,
    fence,
    new_pause,
    new_run,
    replace_parent,
)
from shoal.testing.contract.transactional import CallerTransaction, TransactionalContract
from shoal.testing.contract.trees import TreeContract


class StoreContract(RunContract, ConcurrencyLimitContract, PauseContract, TreeContract,
                    OutboxContract, StatsContract, InspectionContract, ProgressContract,
                    PausedWorkflowContract, RunningCapContract, FlowViewContract,
                    RateLimitContract, FlowRulesTogetherContract,
                    FairnessContract):
    """A whole :class:`~shoal.ports.Store`: every run-store suite. Provide the ``store`` and
    ``other`` fixtures."""


__all__ = [
    "APPROVED",
    "LEASE",
    "NS",
    "T0",
    "CallerTransaction",
    "ConcurrencyLimitContract",
    "CoordContract",
    "CoordDifferential",
    "FairnessContract",
    "FlowRulesTogetherContract",
    "FlowViewContract",
    "InspectionContract",
    "OutboxContract",
    "PauseContract",
    "PausedWorkflowContract",
    "ProgressContract",
    "RateContract",
    "RateDifferential",
    "RateLimitContract",
    "RunContract",
    "RunDifferential",
    "RunningCapContract",
    "StatsContract",
    "StoreContract",
    "TransactionalContract",
    "TreeContract",
    "add",
    "claim",
    "coord_calls",
    "entries",
    "fence",
    "new_pause",
    "new_run",
    "rate_calls",
    "rate_calls_apart",
    "replace_parent",
    "run_calls",
]
