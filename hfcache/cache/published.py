"""What warm published: per repo folder and commit, each file's path, size and hash, and the names marked absent
(what ``verify`` checks a revision against when no lock is given: docs/verify.md).

Where: ``<cache>/.locks/<folder>/hfcache/<commit>.json``, which huggingface_hub never reads (``_cache_manager.py``).
Not a ``trees/<commit>.json``: the library reads that offline, and one naming files the cache does not hold makes
``snapshot_download`` raise ``IncompleteSnapshotError`` (``_snapshot_download.py``). Deterministic JSON (sorted keys,
LF, trailing newline)::

    {"absent": ["chat_template.jinja"], "commit_hash": "<40 hex>", "endpoint": "https://hub.internal",
     "files": {"vocab.txt": {"hash": "git-sha1:<hex>", "size": 231508}}, "format": "hfcache-published", "version": 1}

``endpoint`` (optional) served the commit's last warm (``verify --repair`` fetches from it); only a plain http(s)
URL is written or read back (:func:`public_endpoint`), never a token. A record is untrusted input (docs/security.md):
past :data:`MAX_RECORD_BYTES` or ``MAX_JSON_DEPTH`` it is refused (:class:`RecordRefused`: a problem of its repo); an
entry with a malformed hash or size, or a path that is no safe repo path, is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..bounds import TooDeep, loads_json
from ..errors import CacheError
from ..names import UnsafeName, check_commit, check_folder_name, is_prefixed_hash
from ..records import UnsafePath, valid_size, validate_repo_path
from . import safefs
from .atomic import atomic_write_at
from .sharing import cache_policy, share_fd

#: A record larger than this is not read (16 MiB holds ~150,000 files).
MAX_RECORD_BYTES = 16 * 1024 * 1024
#: Longest endpoint URL recorded or read back.
MAX_ENDPOINT_CHARS = 2048
_FORMAT = "hfcache-published"
_REFUSED_HINT = ("`hfcache verify --repair` removes it (or remove it by hand), then re-warm the repo; someone who "
                 "can write the cache wrote it")


@dataclass(frozen=True)
class PublishedRevision:
    """One record: ``files`` maps path -> (size in bytes, prefixed hash); ``absent`` the names warm marked absent;
    ``endpoint`` the endpoint that served the commit (:func:`public_endpoint`), or None."""

    commit_hash: str
    files: Mapping[str, tuple[int, str]]
    absent: tuple[str, ...]
    endpoint: str | None = None


def public_endpoint(url: object) -> str | None:
    """``url`` as it may be recorded and read back: ``scheme://host[:port][/path]`` without trailing slash, userinfo,
    query or fragment; None but for printable ASCII without spaces, at most :data:`MAX_ENDPOINT_CHARS` long, http(s)."""
    if not isinstance(url, str) or len(url) > MAX_ENDPOINT_CHARS or not (url.isascii() and url.isprintable()) \
            or " " in url:
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


def record_parts(folder_name: str, commit_hash: str) -> tuple[str, ...]:
    """The record's path below the cache root, as components."""
    return ".locks", check_folder_name(folder_name), "hfcache", f"{check_commit(commit_hash)}.json"


def write_record(cache_dir: Path, folder_name: str, commit_hash: str, files: Iterable[tuple[str, int, str]],
                 absent: Iterable[str], endpoint: str | None = None) -> None:
    """Add ``files`` ((path, size, hash)) and ``absent`` to the record of ``folder_name`` at ``commit_hash``, merged
    with an existing one. ``endpoint`` (:func:`public_endpoint`) replaces the recorded one; None keeps it. Written
    atomically through folder fds, under the repo lock. UnsafeLayout: a planted link on the way; OSError."""
    parts = record_parts(folder_name, commit_hash)
    old = read_record(cache_dir, folder_name, commit_hash)
    merged = {p: {"size": s, "hash": h} for p, (s, h) in (old.files.items() if old else ())}
    merged.update({p: {"size": s, "hash": h} for p, s, h in files})
    names = sorted(set(old.absent if old else ()) | set(absent))
    served = public_endpoint(endpoint) or (old.endpoint if old else None)
    doc = {"format": _FORMAT, "version": 1, "commit_hash": commit_hash, "files": merged, "absent": names}
    if served:
        doc["endpoint"] = served
    data = (json.dumps(doc, sort_keys=True, separators=(",", ": ")) + "\n").encode()
    if old is not None and old.files == {p: (v["size"], v["hash"]) for p, v in merged.items()} \
            and old.absent == tuple(names) and old.endpoint == served:
        return
    policy = cache_policy(cache_dir)
    for depth in range(1, len(parts)):  # a group-shared cache: any member re-warms and rewrites the record
        with safefs.dir_fd(cache_dir, parts[:depth], create=True) as fd:  # no link followed
            share_fd(fd, policy)
    with safefs.dir_fd(cache_dir, parts[:-1]) as dfd:  # written relative to the fd: no link followed
        atomic_write_at(dfd, parts[-1], data, policy)


class RecordRefused(CacheError):
    """A record past the bounds hfcache reads (larger than :data:`MAX_RECORD_BYTES`, or JSON nested deeper than
    :data:`hfcache.bounds.MAX_JSON_DEPTH`): a problem of its repo (exit 5), never an internal error."""


def read_record(cache_dir: str | os.PathLike[str], folder_name: str, commit_hash: str) -> PublishedRevision | None:
    """The record of the repo folder ``folder_name`` at ``commit_hash`` (malformed entries left out), or None (none,
    unreadable, not a regular file, malformed). RecordRefused: past the bounds (module docstring)."""
    parts = ()
    try:
        parts = record_parts(folder_name, commit_hash)
        raw = safefs.read_small(cache_dir, parts, MAX_RECORD_BYTES + 1)
    except (OSError, safefs.UnsafeLayout, UnsafeName):
        return None
    where = "/".join(parts)
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordRefused(f"{where}: warm's record is larger than {MAX_RECORD_BYTES} bytes: refused",
                            hint=_REFUSED_HINT)
    try:
        doc = loads_json(raw, where)
    except TooDeep as exc:
        raise RecordRefused(f"{exc}: warm's record refused", hint=_REFUSED_HINT) from None
    except ValueError:
        return None
    try:
        if doc.get("format") != _FORMAT or doc.get("version") != 1 or doc.get("commit_hash") != commit_hash:
            return None
        files = {}
        for path, entry in doc["files"].items():
            size, digest = entry["size"], entry["hash"]
            if _repo_path(path) and valid_size(size) and is_prefixed_hash(digest):
                files[path] = (size, digest)
        absent = tuple(sorted(a for a in doc["absent"] if _repo_path(a)))
        endpoint = public_endpoint(doc.get("endpoint"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return PublishedRevision(commit_hash=commit_hash, files=files, absent=absent, endpoint=endpoint)


def _repo_path(value: object) -> bool:
    """Whether a record's path or absent name is a safe repo path (:func:`hfcache.records.validate_repo_path`)."""
    try:
        return isinstance(value, str) and validate_repo_path(value) == value
    except UnsafePath:
        return False


def remove_record(cache_dir: Path, folder_name: str, commit_hash: str) -> None:
    """Remove the record of a revision that was pruned (no link followed; missing is fine)."""
    with contextlib.suppress(OSError, safefs.UnsafeLayout, UnsafeName):
        safefs.unlink(cache_dir, record_parts(folder_name, commit_hash), missing_ok=True)
