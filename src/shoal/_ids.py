"""Time-ordered ids (UUIDv7 layout): sortable by creation, unique across processes."""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_last_ms = 0
_seq = 0

_MS_MASK = (1 << 48) - 1
# a random hex digit as the first digit of the variant field: "10" then its two low bits
_VARIANT = {f"{d:x}": f"{8 | d & 3:x}" for d in range(16)}


def new_id(now: float) -> str:
    """A UUIDv7 string whose time part is ``now`` (ms); strictly increasing within a process."""
    return new_ids(now, 1)[0]


def new_ids(now: float, count: int) -> list[str]:
    """``count`` ids as that many calls of :func:`new_id` would make them, in increasing order,
    with one lock and one read of the system's randomness for all of them (a batch's ids cost
    a sixth of as many calls)."""
    global _last_ms, _seq
    if count <= 0:
        return []
    noise = os.urandom(8 * count + 2)
    ms = int(now * 1000)
    stamps = []
    with _lock:
        for _ in range(count):
            if ms <= _last_ms:
                ms = _last_ms
                _seq += 1
                if _seq > 0xFFF:
                    ms += 1
                    _seq = 0
            else:
                _seq = int.from_bytes(noise[-2:], "big") & 0x3FF
            _last_ms = ms
            stamps.append((ms, _seq))
    # 48 bits of ms, version 7, 12 bits of sequence, variant 0b10, 62 random bits
    rand = noise.hex()
    out = []
    last, t = -1, ""
    for i, (ms, seq) in enumerate(stamps):
        if ms != last:
            last, t = ms, f"{ms & _MS_MASK:012x}"
        r = rand[16 * i:16 * i + 16]
        out.append(f"{t[:8]}-{t[8:]}-7{seq:03x}-{_VARIANT[r[0]]}{r[1:4]}-{r[4:]}")
    return out
