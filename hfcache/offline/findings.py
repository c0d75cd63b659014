"""What ``hfcache doctor`` reports: :class:`Finding`, its severities, and how huggingface_hub reads a boolean
variable (``constants.py``: ``ENV_VARS_TRUE_VALUES``, compared after ``.upper()``)."""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
FALSE_VALUES = {"0", "OFF", "NO", "FALSE"}


@dataclass(frozen=True)
class Finding:
    """One thing doctor found.

    Attributes:
        code (str): stable identifier, e.g. ``offline.masked``.
        severity (str): ``error``, ``warning`` or ``info``.
        message (str): what is the case, and why it matters.
        fix (str | None): what to do about it.
    """

    code: str
    severity: str
    message: str
    fix: str | None = None


def is_true(value: str | None) -> bool:
    """Whether huggingface_hub reads ``value`` (a variable's value, None when unset) as true."""
    return value is not None and value.upper() in TRUE_VALUES
