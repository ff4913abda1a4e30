"""Store URLs as they may be shown: with any password masked."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


def mask_url(url: str) -> str:
    """The URL with any password (``user:password@`` or ``?password=``) replaced by ``***``."""
    url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
