"""``metered``: a LangChain chat model whose calls go through a shoal provider.

Each call waits for the provider's limits (shared by every replica), reserves its estimated cost
under the budgets (or raises ``shoal.BudgetExceededError``, and the model is not called), then
corrects the tokens and the cost from the reply's ``usage_metadata``: one row of the cost ledger
per call, charged to the run (and tenant) the node works for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig

from shoal.coord.provider import Provider


def _total_tokens(reply: Any) -> int | None:
    usage = getattr(reply, "usage_metadata", None)
    if not usage:
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        return total
    return None


class MeteredModel(Runnable[Any, Any]):
    """``model`` (a chat model, or any runnable that returns a message) called through
    ``provider``; made by :func:`metered`. Async only: ``await model.ainvoke(...)`` in an
    async node."""

    def __init__(self, model: Runnable[Any, Any], provider: Provider, tokens: int,
                 timeout: float | None,
                 retry_after: Callable[[BaseException], float | None] | None) -> None:
        self.model = model
        self.provider = provider
        self.tokens = tokens
        self.timeout = timeout
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"<shoal metered {self.model!r} through {self.provider!r}>"

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        raise TypeError(
            "A metered model waits for its provider's limits asynchronously: call "
            "`await model.ainvoke(...)` in an async node (async def), not model.invoke(...).")

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None,
                      **kwargs: Any) -> Any:
        """The model's reply to ``input``, called once the provider lets the call go; its
        tokens and cost (from ``usage_metadata``) recorded against the provider's window, the
        budgets and the ledger."""
        async with self.provider.call(tokens=self.tokens, timeout=self.timeout) as call:
            try:
                reply = await self.model.ainvoke(input, config, **kwargs)
            except Exception as e:
                wait = self.retry_after(e) if self.retry_after is not None else None
                if wait is None:
                    raise              # a failure: the breaker counts it
                call.rate_limited(wait)
                call.used(tokens=0)    # a 429 costs nothing
                raise
            used = _total_tokens(reply)
            if used is not None:
                call.used(tokens=used)
            return reply


def metered(model: Runnable[Any, Any], provider: Provider, *, tokens: int = 1000,
            timeout: float | None = None,
            retry_after: Callable[[BaseException], float | None] | None = None) -> MeteredModel:
    """``model`` with each call going through ``provider`` (``app.provider(...)``): ``tokens``
    is each call's estimate (counted against ``tokens_per_minute`` and, times the provider's
    ``price_per_token``, reserved under the budgets), corrected by the reply's
    ``usage_metadata["total_tokens"]``. ``timeout`` bounds the wait for the provider's limits
    (``shoal.RateLimitTimeoutError``). ``retry_after(error)`` tells a 429 from the model's
    client: it returns the seconds to pause the provider for every replica (None: not a 429).
    Bind tools first (``metered(model.bind_tools(tools), ...)``)."""
    if not isinstance(model, Runnable):
        raise TypeError(f"metered(model, ...): model is a LangChain chat model or runnable, not "
                        f"{model!r}.")
    if not isinstance(provider, Provider):
        raise TypeError(f"metered(model, provider): provider is what app.provider(...) returns, "
                        f"not {provider!r}.")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"metered(tokens=…) takes an int >= 0, not {tokens!r}.")
    return MeteredModel(model, provider, tokens, timeout, retry_after)
