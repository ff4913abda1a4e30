"""Store URLs as they may be shown: with any password masked."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit, urlunsplit

# a URL carried inside another one's query (PostgreSQL's ?direct_url=), percent-encoded
_NESTED = re.compile(r"([?&]direct_url=)([^&#]*)")


def mask_url(url: str) -> str:
    """The URL with any password (``user:password@`` or ``?password=``, also in a URL its query
    carries as ``direct_url=``) replaced by ``***``."""
    url = _NESTED.sub(lambda m: m.group(1) + quote(mask_url(unquote(m.group(2))), safe="*"), url)
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
