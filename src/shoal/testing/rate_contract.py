"""Where the rate-limit contract used to live: :mod:`shoal.testing.contract.rates` (also
:class:`shoal.testing.contract.RateContract`)."""

from shoal.testing.contract.rates import RateContract, increasing, unwritten
from shoal.testing.contract.support import NS, T0

__all__ = ["NS", "T0", "RateContract", "increasing", "unwritten"]
