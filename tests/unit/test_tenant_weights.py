"""``app.set_tenant_weight`` and ``app.tenant_weights``: the arguments checked by name, the
weights shared by every app of the store (the claim's part runs on every backend in
shoal.testing.contract's FairnessContract)."""

from __future__ import annotations

import math

import pytest

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock


async def test_weights_are_stored_for_every_app_of_the_namespace() -> None:
    store = MemoryStore()
    one = shoal.App("test", store=store, clock=VirtualClock())
    two = shoal.App("test", store=store, clock=VirtualClock())
    elsewhere = shoal.App("other", store=store, clock=VirtualClock())
    await one.set_tenant_weight("acme", 3)
    await one.set_tenant_weight("bo", 0.5)
    assert await two.tenant_weights() == {"acme": 3.0, "bo": 0.5}
    assert await elsewhere.tenant_weights() == {}
    await two.set_tenant_weight("acme", 1)   # the default again
    assert await one.tenant_weights() == {"bo": 0.5}


@pytest.mark.parametrize(("tenant", "weight", "error", "named"), [
    (7, 1, TypeError, "tenant"),
    ("", 1, ValueError, "tenant"),
    ("acme", "2", TypeError, "weight"),
    ("acme", True, TypeError, "weight"),
    ("acme", 0, ValueError, "weight"),
    ("acme", -1.5, ValueError, "weight"),
    ("acme", math.nan, ValueError, "weight"),
    ("acme", math.inf, ValueError, "weight"),
])
async def test_bad_arguments_are_refused_by_name(tenant: object, weight: object,
                                                 error: type[Exception], named: str) -> None:
    app = shoal.App("test", store=MemoryStore(), clock=VirtualClock())
    with pytest.raises(error, match=rf"app\.set_tenant_weight\({named}\)"):
        await app.set_tenant_weight(tenant, weight)  # type: ignore[arg-type]
    assert await app.tenant_weights() == {}
