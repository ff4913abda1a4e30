"""shoal: durable runs and replica coordination through the store you already have."""

from shoal.abort import AbortSignal
from shoal.app import App, AsyncClient, Client, DispatchItem, Workflow
from shoal.clock import Clock, SystemClock
from shoal.coord.lock import Lock
from shoal.coord.membership import Assignment
from shoal.coord.provider import Aimd, Breaker, Provider, ProviderState
from shoal.engine.context import ChildRun, Decision, RunContext
from shoal.errors import (
    AdmissionRejectedError,
    BudgetExceededError,
    CircuitOpenError,
    ClientClosedError,
    ConfigurationError,
    LeaseLostError,
    LockLostError,
    NonDeterminismError,
    NotDeadError,
    NotPausedError,
    NotRetryableError,
    RateLimitTimeoutError,
    RunCancelledError,
    RunFailedError,
    SchemaVersionError,
    ShoalError,
    StoreUnavailableError,
    UnknownOutboxEntryError,
    UnknownPauseError,
    UnknownRunError,
    UnknownWorkflowError,
    WorkflowCodeError,
)
from shoal.health import Health, HealthStatus
from shoal.ports import Store
from shoal.types import (
    CoordinationView,
    OutboxEntry,
    Pause,
    PausedWorkflow,
    Progress,
    QueueDepth,
    Run,
    RunStatus,
    Stats,
)

__version__ = "0.1.0"

__all__ = [
    "AbortSignal",
    "AdmissionRejectedError",
    "Aimd",
    "App",
    "Assignment",
    "AsyncClient",
    "Breaker",
    "BudgetExceededError",
    "ChildRun",
    "CircuitOpenError",
    "Client",
    "ClientClosedError",
    "Clock",
    "ConfigurationError",
    "CoordinationView",
    "Decision",
    "DispatchItem",
    "Health",
    "HealthStatus",
    "LeaseLostError",
    "Lock",
    "LockLostError",
    "NonDeterminismError",
    "NotDeadError",
    "NotPausedError",
    "NotRetryableError",
    "OutboxEntry",
    "Pause",
    "PausedWorkflow",
    "Progress",
    "Provider",
    "ProviderState",
    "QueueDepth",
    "RateLimitTimeoutError",
    "Run",
    "RunCancelledError",
    "RunContext",
    "RunFailedError",
    "RunStatus",
    "SchemaVersionError",
    "ShoalError",
    "Stats",
    "Store",
    "StoreUnavailableError",
    "SystemClock",
    "UnknownOutboxEntryError",
    "UnknownPauseError",
    "UnknownRunError",
    "UnknownWorkflowError",
    "Workflow",
    "WorkflowCodeError",
    "__version__",
]
