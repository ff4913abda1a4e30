"""``shoal.AsyncClient`` and ``shoal.Client``: submit and inspect runs from a process that
executes none (a web process, a script), by workflow name, without the workflows' code.

Both are an :class:`~shoal.App` opened with ``app.open()`` (it connects, and never claims a run or
runs maintenance). :class:`AsyncClient` connects in each event loop that calls it and closes
those connections when that loop ends (or at ``close()``, from any loop).
:class:`Client` is its thin synchronous face for threads without an event loop (Django, Flask,
gunicorn and uwsgi workers): it owns a private event loop in one daemon thread, runs an
AsyncClient there and hands each call's coroutine to it, so any number of threads can share one
Client. A process forked from one that used a client (gunicorn's ``--preload``) gets a fresh one:
the parent's connections and thread are left alone, never closed or used by the child.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import inspect
import os
import queue
import sqlite3
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from shoal import _json
from shoal.app.core import App, Workflow
from shoal.clock import Clock
from shoal.errors import ClientClosedError, SchemaVersionError, StoreUnavailableError
from shoal.ports import Store, TransactionalDispatch
from shoal.stores import mask_url
from shoal.types import NewRun, Pause, PausedWorkflow, Run, RunStatus, Stats

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

T = TypeVar("T")

# Objects a forked child inherited from its parent's clients: kept, never closed or collected
# there (closing them would act on what the parent still uses, such as a socket or a file lock).
_ABANDONED: list[object] = []


class _SubmitterApp(App):
    """The App of a client: as any App, except that a ``sqlite3`` connection given to
    ``dispatch(connection=...)`` by a thread waiting on a :class:`Client` is written on that
    thread (a ``sqlite3`` connection belongs to the thread that made it), not on the loop's."""

    def _transactional(self, connection: object | None, call: str,
                       ) -> TransactionalDispatch | None:
        joined = super()._transactional(connection, call)
        caller = _CALLER.get()
        if joined is None or caller is None or not isinstance(connection, sqlite3.Connection):
            return joined
        return _OnCallerThread(joined, caller)


class _Caller:
    """The thread waiting on a :class:`Client` call: it runs the functions put here, one at a
    time, until the call ends (None is put then)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``make()`` to its end on the caller's thread; it must not wait on anything (the
        SQLite store's writes on a caller's connection never do)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                value = _to_end(make())
            except BaseException as e:   # handed back to the task that asked, as it is
                loop.call_soon_threadsafe(_settle, done, None, e)
            else:
                loop.call_soon_threadsafe(_settle, done, value, None)

        self.jobs.put(job)
        return await done


def _settle(future: asyncio.Future[T], value: T | None, error: BaseException | None) -> None:
    if future.done():
        return   # the asking task was cancelled meanwhile
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)   # type: ignore[arg-type]


def _to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that returns without suspending."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        value: T = done.value
        return value
    coroutine.close()
    raise RuntimeError("shoal: a write in the caller's sqlite3 transaction waited on the event "
                       "loop; it must run as one block")


_CALLER: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar(
    "shoal_client_caller", default=None)


class _OnCallerThread:
    """A store's writes in a caller's transaction, made on the caller's thread."""

    def __init__(self, joined: TransactionalDispatch, caller: _Caller) -> None:
        self.joined = joined
        self.caller = caller

    async def create_run_in(self, connection: object, new: NewRun, *, max_queued: int | None,
                            admission: str) -> tuple[Run, bool]:
        return await self.caller.run(lambda: self.joined.create_run_in(
            connection, new, max_queued=max_queued, admission=admission))

    async def create_runs_in(self, connection: object, news: Sequence[NewRun], *,
                             max_queued: int | None, admission: str,
                             ) -> list[tuple[Run, bool]]:
        return await self.caller.run(lambda: self.joined.create_runs_in(
            connection, news, max_queued=max_queued, admission=admission))


def _name(workflow: str | Workflow[Any, Any]) -> str:
    if isinstance(workflow, Workflow):
        return workflow.name
    if not isinstance(workflow, str):
        raise TypeError(f"A client dispatches a workflow by its name (a str), not "
                        f"{workflow!r:.80}.")
    return workflow


# How long close() waits for another thread's event loop to close what was opened there.
_RELEASE_TIMEOUT = 10.0


async def _nothing(app: App) -> None:
    """The call of ``AsyncClient.open``: only the opening."""


async def _open_app(app: App, connection: object | None) -> None:
    """Open ``app``'s store: migrated if needed, except inside the caller's open SQLite
    transaction, where a schema behind is refused at once with SchemaVersionError. That
    transaction may hold the write lock migrating takes (a view's INSERT, Django's
    ``transaction_mode="IMMEDIATE"``): the migration would wait for its own transaction."""
    inside = isinstance(connection, sqlite3.Connection) and connection.in_transaction
    if not (inside and app.migrate):
        try:
            await app._open_store()
        except StoreUnavailableError as e:
            if connection is not None:
                e.add_note("The client connected for the first time inside the transaction "
                           "of the connection given, and a new store waits for the locks that "
                           "transaction may hold: run 'shoal migrate' (or start a worker) "
                           "once before serving.")
            raise
        return
    app.migrate = False
    try:
        await app._open_store()
    except SchemaVersionError as e:
        if e.found > e.expected:
            raise
        raise SchemaVersionError(
            mask_url(app.store.url), e.found, e.expected,
            why="a client cannot create or upgrade it inside the open transaction of the "
                "sqlite3 connection given to dispatch (its first call here), which holds the "
                "write lock that migrating needs") from None
    finally:
        app.migrate = True


class _Bound:
    """What an AsyncClient holds in one event loop: an App opened there (its connections
    belong to that loop), the calls in flight there, and the async generator that closes the
    App when the loop ends."""

    def __init__(self, app: App, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.lock = asyncio.Lock()
        self.open = False
        self.released = False
        self.calls: dict[asyncio.Task[Any], bool] = {}   # each call's task: True if it waits
        self.abandoned: set[asyncio.Task[Any]] = set()   # waits that close() cancelled
        self.keeper: AsyncGenerator[None, None] | None = None


async def _until_the_loop_ends(client: weakref.ref[AsyncClient], bound: _Bound,
                               ) -> AsyncGenerator[None, None]:
    """Suspended until its event loop finalizes its async generators, which ``asyncio.run``,
    asgiref's ``async_to_sync`` (Django's async views under WSGI) and shoal.Client's loop do
    before closing the loop: the connections made in that loop are then closed there."""
    try:
        yield
    finally:
        bound.keeper = None   # it is closing: _release must not close it again
        owner = client()
        if owner is not None:
            await owner._release(bound)
        elif not bound.released:   # the client was collected: its connections go with it
            bound.released = True
            await bound.app.close()


class AsyncClient:
    """Submit and inspect the runs of ``namespace`` in ``store`` (a URL, or a Store object this
    client never closes) from a process that executes none: ``dispatch`` names the workflow,
    whose options come from the store, where every started worker records them.

    The other options are the App's that matter to a submitter: ``max_queued`` and
    ``admission`` (set them as the workers do: dispatch enforces them), ``version`` (stamped on
    the runs dispatched), ``max_payload_bytes``, ``migrate`` (False: never change the schema,
    refuse one that is behind), ``clock`` and ``tracing`` (``True`` or a ``TracerProvider``: a
    run dispatched under a span continues its trace, as with ``App(tracing=...)``).

    Usable from any event loop: it connects in each loop at that loop's first call and keeps
    those connections for the loop's next calls; when the loop ends (``asyncio.run`` returning,
    a request of Django's async views under WSGI) they are closed. ``close()``, from any loop,
    closes them all: a call waiting then (``result``) raises ClientClosedError, the others
    finish first; a closed client opens again at its next call. Given a Store object, it is
    used from one live loop only (the store's). A forked child starts afresh."""

    def __init__(
        self,
        store: str | Store,
        *,
        namespace: str = "default",
        max_queued: int | None = None,
        admission: Literal["reject", "park"] = "reject",
        version: str | None = None,
        max_payload_bytes: int = _json.MAX_PAYLOAD_BYTES,
        migrate: bool = True,
        clock: Clock | None = None,
        tracing: bool | TracerProvider = False,
    ) -> None:
        def make() -> App:
            return _SubmitterApp(
                namespace, store=store, max_queued=max_queued, admission=admission,
                version=version, max_payload_bytes=max_payload_bytes, migrate=migrate,
                clock=clock, tracing=tracing)

        self._make = make
        self._shared_store = not isinstance(store, str)
        self.app: App = make()   # checks the options now; the App of the first loop to call
        self._pid = os.getpid()
        self._bound: dict[asyncio.AbstractEventLoop, _Bound] = {}
        self._guard = threading.Lock()   # _bound is shared by the threads of the loops
        self._shut = False   # closed for good (the one inside a shoal.Client)

    def __repr__(self) -> str:
        return (f"<shoal.AsyncClient {self.app.namespace!r} "
                f"store={mask_url(self.app.store.url)!r}>")

    @property
    def namespace(self) -> str:
        return self.app.namespace

    async def open(self) -> AsyncClient:
        """Connect in this event loop (and migrate, unless ``migrate=False``). Idempotent.
        Raises StoreUnavailableError when the store cannot be reached."""
        await self._call(_nothing)
        return self

    async def close(self) -> None:
        """Close the store's connections, those made in every event loop (a Store object
        given is left open), each in its own loop. A call waiting meanwhile (``result``)
        raises ClientClosedError; the other calls under way finish first. Idempotent."""
        if self._pid != os.getpid():
            return
        with self._guard:
            bindings = list(self._bound.values())
        loop = asyncio.get_running_loop()
        for bound in bindings:
            await self._release_from(loop, bound)

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _close_for_good(self) -> None:
        """Close, and refuse every later call (a shoal.Client's own client, at its close)."""
        self._shut = True
        await self.close()

    def _binding(self) -> _Bound:
        """What this client holds in the running loop, made at the loop's first call."""
        if self._pid != os.getpid():   # forked: the parent's connections are not ours
            _ABANDONED.extend([self.app, *(b.app for b in self._bound.values())])
            self.app, self._pid, self._bound = self._make(), os.getpid(), {}
            self._guard = threading.Lock()
        loop = asyncio.get_running_loop()
        bound = self._bound.get(loop)
        if bound is not None:
            return bound
        if self._shut:
            raise ClientClosedError(repr(self), in_flight=False)
        with self._guard:
            for ended in [b for b in self._bound.values() if b.loop.is_closed()]:
                self._forget(ended)   # a loop closed without finalizing: nothing can run there
            if self._shared_store and self._bound:
                raise RuntimeError(
                    f"{self!r} was given a Store object, which belongs to the event loop it "
                    f"was opened in, and this call comes from another loop. Give the client a "
                    f"store URL (it then connects in each loop that calls it), or call it from "
                    f"that loop only.")
            free = all(b.app is not self.app for b in self._bound.values())
            bound = self._bound[loop] = _Bound(self.app if free else self._make(), loop)
        return bound

    def _forget(self, bound: _Bound) -> None:
        """Drop ``bound`` (under _guard): its connections are closed when collected."""
        bound.released = True
        if self._bound.get(bound.loop) is bound:
            del self._bound[bound.loop]
        if bound.app is self.app:
            self.app = self._make()

    async def _call(self, make: Callable[[App], Awaitable[T]], *,
                    connection: object | None = None, waits: bool = False) -> T:
        """``make(app)`` with this loop's App, opened. A call that ``waits`` (a result) is
        ended by close() with ClientClosedError; close() lets the others finish first."""
        bound = self._binding()
        task = asyncio.current_task()
        assert task is not None
        bound.calls[task] = waits
        try:
            await self._open(bound, connection)
            return await make(bound.app)
        except asyncio.CancelledError:
            if task in bound.abandoned and task.uncancel() == 0:
                raise ClientClosedError(repr(self), in_flight=True) from None
            raise
        finally:
            bound.calls.pop(task, None)
            bound.abandoned.discard(task)

    async def _open(self, bound: _Bound, connection: object | None) -> None:
        if bound.open:
            return
        async with bound.lock:
            if bound.open:
                return
            if bound.released:   # closed while this call waited for the lock
                raise ClientClosedError(repr(self), in_flight=True)
            await _open_app(bound.app, connection)
            bound.open = True
            bound.keeper = _until_the_loop_ends(weakref.ref(self), bound)
            await bound.keeper.asend(None)   # registered with this loop from now on

    async def _release(self, bound: _Bound) -> None:
        """Close ``bound``'s App, in its own loop, after its calls: those that wait are ended
        (ClientClosedError), the others are let finish. Idempotent."""
        if bound.released:
            return
        with self._guard:
            self._forget(bound)
        for task, waits in bound.calls.items():
            if waits:
                bound.abandoned.add(task)
                task.cancel()
        keeper, bound.keeper = bound.keeper, None
        others = [t for t in bound.calls if t is not asyncio.current_task()]
        try:
            if others:
                await asyncio.wait(others)
        finally:   # cancelled too (its loop ending meanwhile): the connections are closed still
            try:
                await bound.app.close()
            finally:
                if keeper is not None:
                    await keeper.aclose()

    async def _release_from(self, loop: asyncio.AbstractEventLoop, bound: _Bound) -> None:
        """Release ``bound`` from ``loop``, the running one, whichever loop ``bound`` is in."""
        if bound.loop is loop:
            await self._release(bound)
            return
        release = self._release(bound)
        with contextlib.suppress(RuntimeError, TimeoutError):   # that loop stopped meanwhile
            if bound.loop.is_running():   # in another thread: closed there
                done = asyncio.run_coroutine_threadsafe(release, bound.loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(done), _RELEASE_TIMEOUT)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is None or task.cancelling():
                        raise
                    # cancelled there, by its loop ending: which closed the connections
                return
            if not bound.loop.is_closed():   # idle: run there, on a thread of its own
                await asyncio.to_thread(bound.loop.run_until_complete, release)
                return
        if inspect.getcoroutinestate(release) == inspect.CORO_CREATED:
            release.close()
        with self._guard:
            self._forget(bound)   # its loop ended without finalizing, or would not answer

    # -- runs ------------------------------------------------------------------------------

    async def dispatch(
        self,
        workflow: str | Workflow[Any, Any],
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        tenant: str = "default",
        delay: float | None = None,
        max_attempts: int | None = None,
        connection: object | None = None,
        allow_unregistered: bool = False,
    ) -> Run:
        """``app.dispatch`` by the workflow's name: its options (priority, max_attempts, a
        fixed concurrency key) are those a worker recorded in the store. A workflow whose
        concurrency key is computed from the input needs ``concurrency_key=``. A name no
        worker ever registered raises UnknownWorkflowError, unless ``allow_unregistered``."""
        name = _name(workflow)
        return await self._call(lambda app: app.dispatch(
            name, input, idempotency_key=idempotency_key, concurrency_key=concurrency_key,
            priority=priority, tenant=tenant, delay=delay, max_attempts=max_attempts,
            connection=connection, allow_unregistered=allow_unregistered),
            connection=connection)

    async def dispatch_many(
        self,
        workflow: str | Workflow[Any, Any],
        inputs: Iterable[Any],
        *,
        concurrency_key: str | None = None,
        priority: int | None = None,
        tenant: str = "default",
        delay: float | None = None,
        max_attempts: int | None = None,
        connection: object | None = None,
        allow_unregistered: bool = False,
    ) -> list[Run]:
        """``app.dispatch_many`` by the workflow's name (see :meth:`dispatch`)."""
        name = _name(workflow)
        return await self._call(lambda app: app.dispatch_many(
            name, inputs, concurrency_key=concurrency_key, priority=priority, tenant=tenant,
            delay=delay, max_attempts=max_attempts, connection=connection,
            allow_unregistered=allow_unregistered), connection=connection)

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        """The run; UnknownRunError for an unknown id (or another tenant's, given ``tenant``)."""
        return await self._call(lambda app: app.get_run(run_id, tenant=tenant))

    async def list_runs(self, status: RunStatus | str | None = None, workflow: str | None = None,
                        tenant: str | None = None, limit: int = 100, after: str | None = None,
                        ) -> list[Run]:
        """Runs of the namespace in creation order; page with ``after=last.id``."""
        return await self._call(lambda app: app.list_runs(status, workflow, tenant, limit,
                                                          after))

    async def result(self, run_id: str, timeout: float | None = None, *,
                     tenant: str | None = None) -> Any:
        """Wait until the run is final and return its output: RunFailedError,
        RunCancelledError, or TimeoutError after ``timeout`` seconds."""
        return await self._call(lambda app: app.result(run_id, timeout, tenant=tenant),
                                waits=True)

    async def cancel(self, run_id: str, *, tenant: str | None = None) -> Run:
        """Cancel the run (a running one is aborted by the worker executing it)."""
        return await self._call(lambda app: app.cancel(run_id, tenant=tenant))

    async def retry(self, run_id: str, *, tenant: str | None = None) -> Run:
        """Queue a failed or cancelled run again from its checkpoints (``app.retry``)."""
        return await self._call(lambda app: app.retry(run_id, tenant=tenant))

    async def signal(self, run_id: str, name: str, payload: Any = None, *,
                     tenant: str | None = None) -> None:
        """Send signal ``name`` to the run (``app.signal``)."""
        await self._call(lambda app: app.signal(run_id, name, payload, tenant=tenant))

    async def pending_pauses(self, tenant: str | None = None, limit: int = 100) -> list[Pause]:
        """Pauses waiting for a decision, oldest first."""
        return await self._call(lambda app: app.pending_pauses(tenant, limit))

    async def resume(self, pause_id: str, approved: bool = True, data: Any = None,
                     by: str | None = None, *, tenant: str | None = None,
                     reason: str | None = None) -> Pause:
        """Answer a pause (``app.resume``): exactly one answer wins."""
        return await self._call(lambda app: app.resume(pause_id, approved, data, by,
                                                       tenant=tenant, reason=reason))

    async def pause_workflow(self, workflow: str | Workflow[Any, Any],
                             tenant: str | None = None) -> bool:
        """Start no run of the workflow (of ``tenant`` only, if given) on any instance until
        it is resumed (``app.pause_workflow``)."""
        name = _name(workflow)
        return await self._call(lambda app: app.pause_workflow(name, tenant))

    async def resume_workflow(self, workflow: str | Workflow[Any, Any],
                              tenant: str | None = None) -> bool:
        """Drop that pause: its runs start again (``app.resume_workflow``)."""
        name = _name(workflow)
        return await self._call(lambda app: app.resume_workflow(name, tenant))

    async def paused_workflows(self) -> list[PausedWorkflow]:
        """The namespace's paused workflows (``app.paused_workflows``)."""
        return await self._call(lambda app: app.paused_workflows())

    async def set_tenant_weight(self, tenant: str, weight: float) -> None:
        """Store the tenant's shares under ``fairness="tenant"`` (``app.set_tenant_weight``)."""
        await self._call(lambda app: app.set_tenant_weight(tenant, weight))

    async def tenant_weights(self) -> dict[str, float]:
        """The namespace's stored tenant weights (``app.tenant_weights``)."""
        return await self._call(lambda app: app.tenant_weights())

    async def stats(self) -> Stats:
        """The namespace's runs by status and workflow, queue depth, pauses (``app.stats``)."""
        return await self._call(lambda app: app.stats())


class _Loop:
    """A private event loop serving in a daemon thread, and the AsyncClient bound to it."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        self.pid = os.getpid()
        self.client = client
        self.name = name   # the Client's repr, for ClientClosedError
        self.loop = asyncio.new_event_loop()
        # a call is handed to the loop before stop() begins, or refused: none is left unrun
        self.handing = threading.Lock()
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, name="shoal-client", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # as asyncio.run ends: nothing left pending to be destroyed with the loop
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()

    def call(self, make: Callable[[AsyncClient], Awaitable[T]], on_caller: bool) -> T:
        """Run ``make(client)`` on the loop and wait for it here. ``on_caller``: this thread
        serves the writes the call asks of it meanwhile (see :class:`_SubmitterApp`).
        ClientClosedError when the client is closed before or during the call."""
        if threading.get_ident() == self.thread.ident:
            raise RuntimeError("A shoal.Client was called from its own event loop (a callback "
                               "of the client itself): it would wait for itself forever.")
        caller = _Caller() if on_caller else None

        async def go() -> T:
            if caller is not None:
                _CALLER.set(caller)
            return await make(self.client)

        with self.handing:
            if self.stopping:
                raise ClientClosedError(self.name, in_flight=False)
            # run_coroutine_threadsafe starts the task in a copy of this thread's context: the
            # span current in the caller (a web request's) is current in the call, so a run
            # continues it
            future = asyncio.run_coroutine_threadsafe(go(), self.loop)
        try:
            if caller is not None:
                future.add_done_callback(lambda _: caller.jobs.put(None))
                while (job := caller.jobs.get()) is not None:
                    job()
            return future.result()
        except concurrent.futures.CancelledError:
            if self.stopping:   # cancelled as the loop stopped, close() having timed out
                raise ClientClosedError(self.name, in_flight=True) from None
            raise
        except BaseException:
            future.cancel()   # KeyboardInterrupt, or a job failing: the call goes no further
            raise

    def stop(self, timeout: float) -> None:
        """Close the client on the loop (its waiting calls raise ClientClosedError, the others
        end first), then stop the loop and wait for its thread."""
        with self.handing:
            self.stopping = True
        try:
            future = asyncio.run_coroutine_threadsafe(self.client._close_for_good(), self.loop)
            with contextlib.suppress(Exception):
                future.result(timeout)
        finally:
            with contextlib.suppress(RuntimeError):   # the loop closed already
                self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)


class Client:
    """The synchronous client: :class:`AsyncClient`'s verbs, as plain calls, for code that runs
    no event loop (a Django or Flask view, a script). One per process, shared by its threads.

    It connects at its first call, on a private event loop in a daemon thread, and keeps the
    connections for the next calls. ``close()`` (or leaving ``with``) closes them and stops the
    thread, as does the interpreter's exit; a call waiting then (a ``result()`` in another
    thread) and any later call raise ClientClosedError. A
    process forked after the client connected (gunicorn or uwsgi with preload) starts afresh at
    its first call and never touches the parent's connections.

    ``connection=`` of ``dispatch`` and ``dispatch_many`` takes the caller's psycopg 3 (sync)
    ``Connection`` or ``sqlite3.Connection``: the run is written in its open transaction (a
    ``sqlite3`` one on the calling thread, as sqlite3 requires) and exists iff it commits. Do not
    call a Client from inside a coroutine: it blocks that event loop; use AsyncClient there."""

    def __init__(
        self,
        store: str,
        *,
        namespace: str = "default",
        max_queued: int | None = None,
        admission: Literal["reject", "park"] = "reject",
        version: str | None = None,
        max_payload_bytes: int = _json.MAX_PAYLOAD_BYTES,
        migrate: bool = True,
        clock: Clock | None = None,
        tracing: bool | TracerProvider = False,
        close_timeout: float = 10.0,
    ) -> None:
        if not isinstance(store, str):
            raise TypeError(f"shoal.Client(store) takes a store URL, not {store!r:.80}: a Store "
                            f"object belongs to its own event loop (use shoal.AsyncClient).")
        self._options: dict[str, Any] = dict(
            namespace=namespace, max_queued=max_queued, admission=admission, version=version,
            max_payload_bytes=max_payload_bytes, migrate=migrate, clock=clock, tracing=tracing)
        probe = AsyncClient(store, **self._options)   # checks the options now
        self.namespace = namespace
        self.store_url = store
        self._masked = mask_url(probe.app.store.url)
        self.close_timeout = float(close_timeout)
        self._lock = threading.Lock()
        self._loop: _Loop | None = None
        self._closed = False
        _CLIENTS.add(self)

    def __repr__(self) -> str:
        return f"<shoal.Client {self.namespace!r} store={self._masked!r}>"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and stop the client's thread. Idempotent."""
        with self._lock:
            self._closed = True
            serving, self._loop = self._loop, None
        if serving is not None and serving.pid == os.getpid():
            serving.stop(self.close_timeout)

    def _after_fork(self) -> None:
        """In a forked child: the parent's loop thread does not exist here; start afresh."""
        self._lock = threading.Lock()
        if self._loop is not None:
            _ABANDONED.append(self._loop)
            self._loop = None

    def _serving(self) -> _Loop:
        serving = self._loop
        if serving is not None and serving.pid == os.getpid():
            return serving
        with self._lock:
            if self._closed:
                raise ClientClosedError(repr(self), in_flight=False)
            serving = self._loop
            if serving is not None and serving.pid != os.getpid():
                # forked by means that ran no at-fork handler: the same as _after_fork
                _ABANDONED.append(serving)
                serving = None
            if serving is None:
                serving = self._loop = _Loop(AsyncClient(self.store_url, **self._options),
                                              repr(self))
            return serving

    def _call(self, make: Callable[[AsyncClient], Awaitable[T]],
              connection: object | None = None) -> T:
        return self._serving().call(make, isinstance(connection, sqlite3.Connection))

    # -- runs ------------------------------------------------------------------------------

    def dispatch(
        self,
        workflow: str | Workflow[Any, Any],
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        tenant: str = "default",
        delay: float | None = None,
        max_attempts: int | None = None,
        connection: object | None = None,
        allow_unregistered: bool = False,
    ) -> Run:
        """Store a queued run of the workflow named ``workflow`` (see
        :meth:`AsyncClient.dispatch`) and return it."""
        return self._call(lambda c: c.dispatch(
            workflow, input, idempotency_key=idempotency_key, concurrency_key=concurrency_key,
            priority=priority, tenant=tenant, delay=delay, max_attempts=max_attempts,
            connection=connection, allow_unregistered=allow_unregistered), connection)

    def dispatch_many(
        self,
        workflow: str | Workflow[Any, Any],
        inputs: Iterable[Any],
        *,
        concurrency_key: str | None = None,
        priority: int | None = None,
        tenant: str = "default",
        delay: float | None = None,
        max_attempts: int | None = None,
        connection: object | None = None,
        allow_unregistered: bool = False,
    ) -> list[Run]:
        """Store a batch of runs of one workflow, all or nothing (``app.dispatch_many``)."""
        items = list(inputs)   # read here: a generator belongs to the caller's thread
        return self._call(lambda c: c.dispatch_many(
            workflow, items, concurrency_key=concurrency_key, priority=priority, tenant=tenant,
            delay=delay, max_attempts=max_attempts, connection=connection,
            allow_unregistered=allow_unregistered), connection)

    def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        """The run; UnknownRunError for an unknown id (or another tenant's, given ``tenant``)."""
        return self._call(lambda c: c.get_run(run_id, tenant=tenant))

    def list_runs(self, status: RunStatus | str | None = None, workflow: str | None = None,
                  tenant: str | None = None, limit: int = 100, after: str | None = None,
                  ) -> list[Run]:
        """Runs of the namespace in creation order; page with ``after=last.id``."""
        return self._call(lambda c: c.list_runs(status, workflow, tenant, limit, after))

    def result(self, run_id: str, timeout: float | None = None, *,
               tenant: str | None = None) -> Any:
        """Wait (blocking this thread) until the run is final and return its output:
        RunFailedError, RunCancelledError, or TimeoutError after ``timeout`` seconds."""
        return self._call(lambda c: c.result(run_id, timeout, tenant=tenant))

    def cancel(self, run_id: str, *, tenant: str | None = None) -> Run:
        """Cancel the run (a running one is aborted by the worker executing it)."""
        return self._call(lambda c: c.cancel(run_id, tenant=tenant))

    def retry(self, run_id: str, *, tenant: str | None = None) -> Run:
        """Queue a failed or cancelled run again from its checkpoints (``app.retry``)."""
        return self._call(lambda c: c.retry(run_id, tenant=tenant))

    def signal(self, run_id: str, name: str, payload: Any = None, *,
               tenant: str | None = None) -> None:
        """Send signal ``name`` to the run (``app.signal``)."""
        self._call(lambda c: c.signal(run_id, name, payload, tenant=tenant))

    def pending_pauses(self, tenant: str | None = None, limit: int = 100) -> list[Pause]:
        """Pauses waiting for a decision, oldest first."""
        return self._call(lambda c: c.pending_pauses(tenant, limit))

    def resume(self, pause_id: str, approved: bool = True, data: Any = None,
               by: str | None = None, *, tenant: str | None = None,
               reason: str | None = None) -> Pause:
        """Answer a pause (``app.resume``): exactly one answer wins."""
        return self._call(lambda c: c.resume(pause_id, approved, data, by, tenant=tenant,
                                             reason=reason))

    def pause_workflow(self, workflow: str | Workflow[Any, Any],
                       tenant: str | None = None) -> bool:
        """Start no run of the workflow (of ``tenant`` only, if given) on any instance until
        it is resumed (``app.pause_workflow``)."""
        return self._call(lambda c: c.pause_workflow(workflow, tenant))

    def resume_workflow(self, workflow: str | Workflow[Any, Any],
                        tenant: str | None = None) -> bool:
        """Drop that pause: its runs start again (``app.resume_workflow``)."""
        return self._call(lambda c: c.resume_workflow(workflow, tenant))

    def paused_workflows(self) -> list[PausedWorkflow]:
        """The namespace's paused workflows (``app.paused_workflows``)."""
        return self._call(lambda c: c.paused_workflows())

    def set_tenant_weight(self, tenant: str, weight: float) -> None:
        """Store the tenant's shares under ``fairness="tenant"`` (``app.set_tenant_weight``)."""
        self._call(lambda c: c.set_tenant_weight(tenant, weight))

    def tenant_weights(self) -> dict[str, float]:
        """The namespace's stored tenant weights (``app.tenant_weights``)."""
        return self._call(lambda c: c.tenant_weights())

    def stats(self) -> Stats:
        """The namespace's runs by status and workflow, queue depth, pauses (``app.stats``)."""
        return self._call(lambda c: c.stats())


# Every Client alive: closed at the interpreter's exit, started afresh in a forked child.
_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()


def _close_all() -> None:
    for client in list(_CLIENTS):
        with contextlib.suppress(Exception):
            client.close()


def _forked() -> None:
    for client in list(_CLIENTS):
        client._after_fork()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forked)
