"""The browser tests' fixtures live in ``browser_support.py`` (so that tests can import its
helpers by a name no other test directory uses)."""

from browser_support import browser, console, driver, shop, shots

__all__ = ["browser", "console", "driver", "shop", "shots"]
