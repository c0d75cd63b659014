"""Which id the pull-through mirror stores an upstream answer under (docs/serve.md, "Ids, as the Hub resolves
them"), and its bounded memory of them (:class:`Names`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from ..records import folder_ids

__all__ = ["Names", "keep", "storage_id"]


def storage_id(asked: str, answered: str, spelled: Callable[[str], str | None]) -> tuple[str, str | None]:
    """``(id to store and answer under, legacy id whose own folder is filled too or None)`` for the id ``asked``
    and the one upstream ``answered``: ``answered`` only where warm follows it (:func:`hfcache.records.folder_ids`),
    matched without case; ``spelled``: the cache's spelling of an id (without case), if any."""
    legacy = None
    if answered == asked or answered.lower() == asked.lower():
        stored = answered  # the same repo, as the upstream spells it
    elif len(folder_ids(asked, answered)) == 2:
        stored, legacy = answered, asked  # the Hub's own rename: bert-base-uncased -> google-bert/bert-base-uncased
    elif "/" not in asked and answered.count("/") == 1 and answered.split("/")[1].lower() == asked.lower():
        stored = answered  # a case variant of a legacy id: the canonical folder only, no folder per variant
    else:
        stored = asked  # not followed (records.folder_ids): kept where the request would be stored
    existing = spelled(stored)
    if existing is not None and existing != stored:
        stored = existing
    if legacy is not None:
        legacy = spelled(legacy) or legacy
    return stored, legacy


class Names:
    """Bounded memory of the ids upstream resolved: asked id (ignoring case) -> stored id, and the legacy id whose
    folder a stored id also fills; at most ``kept`` (int) of each, the least recently used forgotten first."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._stored: OrderedDict[tuple[str, str], str] = OrderedDict()  # (type, asked.lower()) -> stored id
        self._legacy: OrderedDict[tuple[str, str], str] = OrderedDict()  # (type, stored) -> legacy id

    def record(self, repo_type: str, asked: str, stored: str, legacy: str | None) -> None:
        with self._lock:
            keep(self.kept, self._stored, (repo_type, asked.lower()), stored)
            keep(self.kept, self._stored, (repo_type, stored.lower()), stored)
            if legacy is not None:
                keep(self.kept, self._legacy, (repo_type, stored), legacy)

    def stored(self, repo_type: str, asked: str) -> str | None:
        """The id ``asked`` was stored under (None: not resolved, or forgotten)."""
        with self._lock:
            return self._stored.get((repo_type, asked.lower()))

    def legacy(self, repo_type: str, stored: str) -> str | None:
        with self._lock:
            return self._legacy.get((repo_type, stored))

    def askers(self, stored: str) -> list[str]:
        """The ids (lowercase) that resolved to ``stored``, any type: an allowed one lets ``stored`` be fetched."""
        with self._lock:
            return [asked for (_, asked), value in self._stored.items() if value == stored]


def keep(kept: int, table: OrderedDict, key: tuple, value: object) -> None:
    """``table[key] = value`` as the most recently used entry, dropping the least recently used past ``kept``."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > kept:
        table.popitem(last=False)
