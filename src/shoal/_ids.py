"""Time-ordered ids (UUIDv7 layout): sortable by creation, unique across processes."""

from __future__ import annotations

import os
import threading
import uuid

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def new_id(now: float) -> str:
    """A UUIDv7 string whose time part is ``now`` (ms); strictly increasing within a process."""
    global _last_ms, _seq
    ms = int(now * 1000)
    with _lock:
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            if _seq > 0xFFF:
                ms += 1
                _seq = 0
        else:
            _seq = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _last_ms = ms
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    return str(uuid.UUID(int=value))
