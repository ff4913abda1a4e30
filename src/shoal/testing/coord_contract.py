"""Where the coordination contract used to live: :mod:`shoal.testing.contract.coordination`
(also :class:`shoal.testing.contract.CoordContract`)."""

from shoal.testing.contract.coordination import (
    LEASE,
    TTL,
    WARMUP,
    CoordContract,
    exactly,
    grant,
    queued,
)
from shoal.testing.contract.support import NS, T0

__all__ = ["LEASE", "NS", "T0", "TTL", "WARMUP", "CoordContract", "exactly", "grant", "queued"]
