"""Durations and sizes as people write them on a command line (``30d``, ``12h``, ``50GB``, ``500MiB``); pure. Sizes
follow Kubernetes' SI/IEC convention (:data:`_SIZE_UNITS`: ``K``..``TB`` powers of 1000, ``Ki``..``TiB`` of 1024; a
bare number is bytes), letters case-insensitive.
"""

from __future__ import annotations

import math
import re

from .errors import UsageError

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds of ``text``: a non-negative number and one unit, ``s``, ``m``, ``h``, ``d`` or ``w`` (``30d`` ->
    2592000.0). UsageError: no unit (``30`` is ambiguous), an unknown unit, a negative or malformed number."""
    match = _DURATION_RE.fullmatch(text or "")
    if not match:
        raise UsageError(f"invalid duration {text!r}",
                         hint="use a number and a unit: 45s, 90m, 12h, 30d or 2w")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def parse_size(text: str) -> int:
    """Bytes of ``text``, rounded down: a non-negative number and an optional unit (module docstring; ``50GB`` ->
    50000000000). UsageError: an unknown unit, a negative or malformed number."""
    match = _SIZE_RE.fullmatch(text or "")
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise UsageError(f"invalid size {text!r}",
                         hint="use a number and a unit: 500MB, 50GB, 1.5G (powers of 1000) or 500MiB, 20GiB "
                              "(powers of 1024); a bare number is bytes")
    return math.floor(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_timeout(value: str | float) -> float:
    """``"30"`` -> 30.0: seconds, a finite number greater than 0; else UsageError (``nan``, ``inf``, ``0``)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"invalid timeout {value!r}", hint="give a number of seconds greater than 0, e.g. 30")
    return seconds


def format_duration(seconds: float) -> str:
    """2592000 -> ``30d``; the largest unit that divides the value exactly, else seconds (``90m``, ``45s``)."""
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def human_size(n: int | float) -> str:
    """1536 -> '1.5 KiB' (binary units, as ``du -h``)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
