"""The manifest (``hfcache.toml``, or ``[tool.hfcache]`` in ``pyproject.toml``: docs/warm.md, 'Pinning'): finding,
reading and validating it (the entry rules are shared with the lock), and who gets the Hub token for its endpoints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ..errors import UsageError
from ..records import DEFAULT_ENDPOINT, KINDS, REPO_TYPES, TRUST_ENDPOINT_ENV, HubOptions, WarmRequest, shown
from ..records import MAX_REVISION_BYTES as MAX_REVISION  # a manifest or lock counts characters

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

T = TypeVar("T")
MANIFEST_NAME = "hfcache.toml"
_MANIFEST_KEYS = {"endpoint", "cache_dir", "repos"}
ENTRY_KEYS = {"repo_id", "revision", "kind", "include", "exclude", "repo_type"}


class ManifestNotFound(UsageError):
    """No manifest where one was looked for."""


@dataclass(frozen=True)
class Manifest:
    """What the user asked for: ``path`` read, ``endpoints`` in order (empty: none set), ``cache_dir`` (relative to
    the manifest's folder, or None), ``repos`` (one WarmRequest per entry, in file order)."""

    path: Path
    endpoints: tuple[str, ...]
    cache_dir: Path | None
    repos: tuple[WarmRequest, ...]


def request_key(request: WarmRequest) -> tuple[str, str, str]:
    """What identifies an entry of the manifest or the lock: ``(repo_id, revision, repo_type)``."""
    return (request.repo_id, request.revision, request.repo_type)


def find_manifest(path: str | os.PathLike[str] | None = None, start: Path | None = None) -> Path:
    """The manifest to use: ``path`` when given, else ``hfcache.toml`` or a ``pyproject.toml`` with a
    ``[tool.hfcache]`` table in ``start`` (default: the working directory). Raises ManifestNotFound (a UsageError)."""
    if path is not None:
        return Path(path)
    folder = start or Path.cwd()
    if (folder / MANIFEST_NAME).is_file():
        return folder / MANIFEST_NAME
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # ValueError: TOMLDecodeError, undecodable, a 5,000-digit int
            data = {}
        tool = data.get("tool")
        if isinstance(tool, dict) and "hfcache" in tool:  # `tool = 1` or `tool = ["hfcache"]` is no [tool.hfcache]
            return pyproject
    raise ManifestNotFound(f"no {MANIFEST_NAME} (or pyproject.toml with [tool.hfcache]) in {folder}",
                           hint="write one (see docs/warm.md, 'Pinning') or pass --manifest FILE")


def read_toml(path: Path, what: str, data: bytes | None = None) -> dict[str, Any]:
    """The TOML document at ``path`` (the manifest or the lock: ``what``; ``data``: its bytes, already read), or
    UsageError naming the file."""
    try:
        text = path.read_text(encoding="utf-8") if data is None else data.decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer over 4,300 digits (int()'s limit, Python 3.11): was 70
        raise UsageError(f"{path}: invalid TOML: {str(exc).splitlines()[0][:200]}", hint=f"fix the {what}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise UsageError(f"{path}: invalid TOML: nested too deep", hint=f"fix the {what}") from None


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate a manifest (its shape: docs/warm.md, 'Pinning'). Raises UsageError: unreadable, invalid
    TOML, unknown key, wrong type or value, duplicate entry; naming the file, the entry and the field."""
    path = Path(path)
    data = read_toml(path, "manifest")
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        data = tool.get("hfcache") if isinstance(tool, dict) else None
        if not isinstance(data, dict):
            raise UsageError(f"{path}: no [tool.hfcache] table", hint="add one, or write hfcache.toml")
    where = str(path) if path.name != "pyproject.toml" else f"{path} [tool.hfcache]"
    if unknown := sorted(set(data) - _MANIFEST_KEYS):
        raise UsageError(f"{where}: unknown key {shown(unknown[0])}",
                         hint=f"allowed: {', '.join(sorted(_MANIFEST_KEYS))}")
    endpoint = data.get("endpoint")
    if isinstance(endpoint, str):
        endpoint = [endpoint]
    if endpoint is not None and (not isinstance(endpoint, list) or not endpoint
                                 or not all(isinstance(e, str) and e for e in endpoint)):
        raise UsageError(f"{where}: field 'endpoint' must be a URL or a list of URLs, got "
                         f"{shown(data.get('endpoint'))}")
    cache_dir = data.get("cache_dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir):
        raise UsageError(f"{where}: field 'cache_dir' must be a non-empty string, got {shown(cache_dir)}")
    entries = data.get("repos", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{where}: 'repos' must be an array of tables ([[repos]])")
    if not entries:
        raise UsageError(f"{where}: no [[repos]] entries", hint="add at least one [[repos]] with a repo_id")
    repos = unique_entries((manifest_entry(e, f"{where}: repos[{i}]") for i, e in enumerate(entries)), where)
    # cache_dir: ``~`` only, never environment variables (``${HF_TOKEN}`` would put the token in a folder name).
    return Manifest(path=path, endpoints=tuple(e.rstrip("/") for e in endpoint or ()), repos=tuple(repos),
                    cache_dir=_manifest_cache_dir(path, cache_dir, where) if cache_dir else None)


def unique_entries(items: Iterable[T], where: str, request: Callable[[T], WarmRequest] = lambda item: item,
                   hint: str | None = None) -> list[T]:
    """``items`` (entries of the manifest or lock ``where``) as a list, when no two ``request(item)`` share a
    :func:`request_key`; else UsageError with ``hint``."""
    seen: dict[tuple[str, str, str], int] = {}
    out = []
    for index, item in enumerate(items):
        key = request_key(request(item))
        if key in seen:
            raise UsageError(f"{where}: repos[{index}] ({request(item).spec}) repeats repos[{seen[key]}]", hint=hint)
        seen[key] = index
        out.append(item)
    return out


def withheld_endpoints(endpoints: Sequence[str], trusted: bool,
                       environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The manifest's ``endpoints`` that get no Hub token: without the opt-in (``trusted``), each whose origin
    (scheme, host, port) is neither ``HF_ENDPOINT``'s nor the public Hub's; as given, without a trailing slash."""
    from ..hub.urls import origin

    if trusted:
        return ()
    env = os.environ if environ is None else environ
    allowed = {origin(DEFAULT_ENDPOINT)} | ({origin(env["HF_ENDPOINT"])} if env.get("HF_ENDPOINT") else set())
    out = []
    for endpoint in endpoints:
        with suppress(ValueError):  # not a URL at all: the client refuses it (exit 2), no token is ever sent
            if origin(endpoint) in allowed:
                continue
        out.append(endpoint.rstrip("/"))
    return tuple(out)


def with_manifest_endpoints(hub: HubOptions, endpoints: Sequence[str], trust: bool = False) -> HubOptions:
    """``hub`` for a manifest that names ``endpoints``: the endpoints given win; else the manifest's, the token
    withheld from those not opted in to (``trust``, or :data:`TRUST_ENDPOINT_ENV`; never a key of the manifest)."""
    if hub.endpoints or not endpoints:
        return hub
    trust = trust or os.environ.get(TRUST_ENDPOINT_ENV, "").strip().lower() in ("1", "true", "yes")
    return replace(hub, endpoints=tuple(endpoints), withheld=withheld_endpoints(endpoints, trust))


def _manifest_cache_dir(path: Path, cache_dir: str, where: str) -> Path:
    """The manifest's ``cache_dir`` relative to its folder, ``~``/``~user`` expanded and checked (UsageError)."""
    from ..cache.root import check_path_text, expand_user

    what = f"{where}: field 'cache_dir'"
    joined = path.parent / expand_user(cache_dir, what)
    check_path_text(joined.absolute(), what)
    return joined


def str_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    """A field that must be an array of non-empty strings, as a tuple; else UsageError naming it."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where}: field {key!r} must be an array of non-empty strings, got {shown(value)}")
    return tuple(value)


def manifest_entry(entry: dict[str, Any], where: str) -> WarmRequest:
    """One ``[[repos]]`` entry (of the manifest, or a locked repo's request) as a WarmRequest."""
    repo_id = entry.get("repo_id")
    if not isinstance(repo_id, str) or not repo_id:
        raise UsageError(f"{where}: field 'repo_id' is required and must be a string")
    where = f"{where} ({repo_id if repo_id.isprintable() and len(repo_id) <= 200 else shown(repo_id)})"
    if unknown := sorted(set(entry) - ENTRY_KEYS):
        raise UsageError(f"{where}: unknown field {shown(unknown[0])}",
                         hint=f"allowed: {', '.join(sorted(ENTRY_KEYS))}")
    for key, allowed in (("kind", KINDS), ("repo_type", REPO_TYPES)):
        if key in entry and entry[key] not in allowed:
            raise UsageError(f"{where}: field {key!r} must be one of {', '.join(allowed)}, got {shown(entry[key])}")
    revision = entry.get("revision", "main")
    if not isinstance(revision, str):
        raise UsageError(f"{where}: field 'revision' must be a string, got {shown(revision)}")
    if len(revision) > MAX_REVISION:
        raise UsageError(f"{where}: field 'revision' is {len(revision)} characters long (at most {MAX_REVISION})",
                         hint="use a branch, tag or 40-hex commit")
    include = str_list(entry.get("include", []), where, "include")
    exclude = str_list(entry.get("exclude", []), where, "exclude")
    try:
        return WarmRequest(repo_id=repo_id, revision=revision, kind=entry.get("kind", "tokenizer"),
                           repo_type=entry.get("repo_type", "model"), include=include, exclude=exclude)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", hint=exc.hint) from None
