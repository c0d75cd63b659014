"""fast_record: what ``hfcache check`` proved about the fast tokenizer path, per repo and commit.

Read and written under :mod:`hfcache.cache.owned_record`'s rules. A ``differs`` entry only ever makes
``load_tokenizer(backend="tokenizers")`` refuse, so it is honoured from any record read safely, whoever wrote it. An
``equal`` entry is proof only from a *trusted* record (owned by this euid or by root: an image built as root, run as
another uid); needed only with ``require_proof=True``, it never makes the fast path load a repo it refuses statically.
"""

from __future__ import annotations

import json

from ..cache import owned_record
from .fast_inputs import printable

RECORD = (".locks", "hfcache-fast-tokenizers.json")
MAX_RECORD_BYTES = 16 * 1024 * 1024
MAX_ENTRIES = 100_000
_VERSION = 1


def key(repo_type: str, repo_id: str, commit: str) -> str:
    return f"{repo_type}/{repo_id}@{commit}"


def load(cache_dir: str) -> tuple[dict[str, dict], bool]:
    """The record's entries (key -> ``{"verdict": str, "tokenizers": str}``) and whether the record is trusted;
    ``({}, False)`` when there is none or it cannot be read (too large, too deep, malformed, not a regular file)."""
    loaded = owned_record.load(cache_dir, RECORD[-1], MAX_RECORD_BYTES, root_ok=True, read_untrusted=True)
    data = loaded.data
    if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("repos"), dict):
        return {}, False
    entries = {k: v for k, v in list(data["repos"].items())[:MAX_ENTRIES]
               if isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("verdict"), str)}
    return entries, loaded.trusted


def recorded_difference(cache_dir: str, record_key: str) -> str | None:
    """The ``differs: ...`` verdict recorded for ``record_key`` (from any record read safely), else None."""
    entry = load(cache_dir)[0].get(record_key)
    verdict = entry.get("verdict") if entry else None
    if not isinstance(verdict, str) or not verdict.startswith("differs"):
        return None
    return printable(verdict, 500)  # any member may have written it


def proven_equal(cache_dir: str, record_key: str, tokenizers_version: str) -> bool:
    """Whether a trusted record says ``equal`` for ``record_key`` with this ``tokenizers`` version."""
    entries, trusted = load(cache_dir)
    entry = entries.get(record_key) or {}
    return trusted and entry.get("verdict") == "equal" and entry.get("tokenizers") == tokenizers_version


def save(cache_dir: str, verdicts: dict[str, str], tokenizers_version: str) -> bool:
    """Record ``verdicts`` (key -> ``"equal"`` | ``"differs: ..."``; ``refused`` verdicts are not recorded: the
    refusal is static) over the trusted entries already recorded; False when the cache cannot be written."""
    entries, trusted = load(cache_dir)
    kept = entries if trusted else {}
    for record_key, verdict in verdicts.items():
        if verdict == "equal" or verdict.startswith("differs"):
            kept[record_key] = {"verdict": verdict[:2000], "tokenizers": tokenizers_version}
    data = json.dumps({"version": _VERSION, "repos": dict(list(kept.items())[-MAX_ENTRIES:])},
                      ensure_ascii=True, sort_keys=True).encode()
    return owned_record.save(cache_dir, RECORD[-1], data)
