"""Output of ``hfcache path``: one absolute path a line (so ``$(hfcache path ...)`` works), or one JSON document."""

from __future__ import annotations

import sys
from typing import Any

from .common import print_json


def path_document(resolved: Any) -> dict[str, Any]:
    """The ``--json`` document of a :class:`hfcache.offline.paths.ResolvedPath`: ``repo_id``, ``repo_type``,
    ``revision``, ``commit_hash``, ``snapshot`` (absolute) and ``files`` (absolute snapshot paths; empty without a
    PATTERN)."""
    return {"repo_id": resolved.repo_id, "repo_type": resolved.repo_type, "revision": resolved.revision,
            "commit_hash": resolved.commit_hash, "snapshot": str(resolved.snapshot),
            "files": [str(p) for p in resolved.files]}


def show_path(resolved: Any, *, as_json: bool) -> None:
    """Print the snapshot folder (no PATTERN) or each matching file on its own line, nothing else; or the JSON
    document. Every path was checked to be one printable line (hfcache/offline/paths.py)."""
    if as_json:
        print_json(path_document(resolved))
        return
    lines = [str(p) for p in resolved.files] if resolved.pattern is not None else [str(resolved.snapshot)]
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
