"""One exception tree for hfcache; each class carries its exit code (docs/cli.md "Exit codes") and a hint. Imports
nothing from hfcache: every layer raises these, and the CLI maps them to exit codes in one place.
"""

from __future__ import annotations


class HfcacheError(Exception):
    """Base of every error hfcache raises on purpose: ``exit_code``, the CLI's; ``hint``, one line telling the user
    what to do next (or None)."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    hint: str | None = None

    def __str__(self) -> str:
        return self.message


class CheckFailed(HfcacheError):
    """A check found a problem (verify mismatch, lock out of date): exit 1, as the base."""


class UsageError(HfcacheError):
    """Bad input: malformed repo id, manifest, option value."""

    exit_code = 2


class HubError(HfcacheError):
    """The endpoint could not serve what was asked (not found, unauthorized, unreachable, bad data)."""

    exit_code = 3


class RepoNotFound(HubError):
    """The endpoint has no such repo, or it is private and the token does not grant access."""


class RevisionNotFound(HubError):
    """The repo exists but the revision does not."""


class GatedRepo(HubError):
    """The repo is gated or forbidden for this token."""


class EndpointUnreachable(HubError):
    """Connection refused, DNS failure, or no answer within the timeout."""


class IntegrityError(HubError):
    """Downloaded bytes do not match the hash or size the endpoint published."""


class OfflineViolation(HfcacheError):
    """A network access was attempted where offline mode is enforced."""

    exit_code = 4


class CacheError(HfcacheError):
    """The cache directory cannot be written or read (permissions, disk full, corrupt layout)."""

    exit_code = 5


class InternalError(HfcacheError):
    """A bug in hfcache: an unexpected exception, reported with exit code 70 instead of a traceback."""

    exit_code = 70
