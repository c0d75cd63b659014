"""An endpoint's answers, read as untrusted input: the repo info fields hfcache reads, tree entries, and every
id, path and size checked before it is used.

Every id parsed from an answer is validated (commit 40 hex, blob ids 40/64 lowercase hex, safe paths) and a source
that gives no hash or size for a file is an error naming the file: hash checks stay mandatory. A value of the wrong
JSON type anywhere (a list where a string is due, a float or a bool where a size is) is a :class:`HubError` (exit 3)
naming the field, quoted at most 80 characters long. Error answers are rebuilt before huggingface_hub reads them
(:func:`error_document`). Standard library, hfcache's records and bounds only: the requests are
:mod:`hfcache.hub.client`'s.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from ..bounds import TooDeep, loads_json
from ..errors import HubError
from ..records import MAX_FILE_SIZE, UnsafePath, shown, valid_repo_id, valid_size, validate_repo_path
from .files import RemoteFile, RepoRevision

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
BLOB_ID_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class Sibling(NamedTuple):
    """One entry of a repo info's ``siblings`` as the Hub spells it: ``rfilename``, ``size``, ``blobId``,
    ``lfs.sha256`` (``RepoSibling``/``BlobLfsInfo`` in huggingface_hub's hf_api.py). Values unchecked: see
    :func:`remote_file`."""

    rfilename: object
    size: object
    blob_id: object
    lfs_sha256: object


class RepoInfo(NamedTuple):
    """The fields of ``GET /api/{type}s/{repo_id}/revision/{rev}?blobs=true`` hfcache reads; ``siblings`` is None
    when the answer has none (``"siblings": null`` or missing), as ``ModelInfo.siblings``."""

    id: str | None
    sha: str | None
    siblings: list[Sibling] | None


def parse_repo_info(data: dict) -> RepoInfo:
    """The repo info fields hfcache reads, with ``ModelInfo.__init__``'s keys (hf_api.py).

    Raises:
        KeyError, TypeError: a sibling without ``rfilename`` or not an object, ``lfs`` not an object, ``id`` or
            ``sha`` not a string (mapped to a one-line HubError by :mod:`hfcache.hub.client`).
    """
    raw = data.get("siblings")
    siblings = None
    if raw is not None:
        if not isinstance(raw, list):
            raise TypeError("siblings is not a JSON array")
        siblings = []
        for entry in raw:
            if not isinstance(entry, dict):
                raise TypeError(f"a sibling is not an object: {entry!r:.80}")
            lfs = entry.get("lfs") or None
            if lfs is not None and not isinstance(lfs, dict):
                raise TypeError(f"lfs of {entry.get('rfilename')!r:.80} is not an object")
            siblings.append(Sibling(entry["rfilename"], entry.get("size"), entry.get("blobId"),
                                    lfs.get("sha256") if lfs else None))
    for key in ("id", "sha"):
        if not isinstance(data.get(key), (str, type(None))):
            raise TypeError(f"{key} is not a string")
    return RepoInfo(data.get("id"), data.get("sha"), siblings)


def answered_identity(endpoint: str, repo_id: str, info: RepoInfo) -> tuple[str, str]:
    """``(canonical id, commit)`` of a repo info answer for ``repo_id``, checked.

    Raises:
        HubError: an invalid repo id, or a commit that is not 40 hex characters.
    """
    commit = info.sha or ""
    canonical_id = info.id or repo_id
    if "/" in repo_id and canonical_id != repo_id:
        # Only a legacy id (no org) is renamed by the Hub (``gpt2`` -> ``openai-community/gpt2``); an
        # ``org/name`` request answered with another id is taken as the requested repo (README: stored under the
        # requested id only): its files are fetched from the requested repo's URLs, no other id is claimed.
        canonical_id = repo_id
    if not valid_repo_id(canonical_id):
        raise HubError(f"{repo_id}: {endpoint} answered an invalid repo id {shown(canonical_id)}",
                       hint="the endpoint is broken or hostile")
    if not COMMIT_RE.fullmatch(commit):
        raise HubError(f"{repo_id}: {endpoint} answered commit {shown(commit)}, not 40 hex characters",
                       hint="the endpoint is broken or not Hub-compatible")
    return canonical_id, commit


def check_asked_commit(endpoint: str, repo_id: str, revision: str, commit: str) -> None:
    """A revision that is a full commit (40 lowercase hex) must be answered as itself.

    Args:
        endpoint (str): names the endpoint (or ``"the lock"``) in the error.
        repo_id (str): the requested id. revision (str): the requested revision. commit (str): the answered one.

    Raises:
        HubError: ``revision`` is 40 hex and ``commit`` is another sha (exit 3, naming the endpoint and both).
    """
    if COMMIT_RE.fullmatch(revision) and commit != revision:
        raise HubError(f"{repo_id}: asked for commit {revision}, {endpoint} answered commit {shown(commit)}",
                       hint="the endpoint is broken or hostile: a full commit sha must be answered as itself")


def check_listing(endpoint: str, repo: RepoRevision, info: RepoInfo) -> None:
    """Refuse a resolved repo without any file listing, or whose listing names a path as a file and as a folder.

    Raises:
        HubError: either fault of the endpoint.
    """
    if info.siblings is None and not repo.paths:
        # No listing at all (``"siblings": null`` and no tree): an endpoint fault, not an empty selection.
        raise HubError(f"{repo.repo_id}: {endpoint} answered no file listing (siblings) for {repo.revision}",
                       hint="the endpoint is broken or not Hub-compatible")
    clash = file_and_folder(set(repo.paths))
    if clash:
        raise HubError(f"{repo.repo_id}: endpoint listed {shown(clash)} as a file and as a folder",
                       hint="the endpoint is broken or hostile")


def tree_entry(endpoint: str, repo_id: str, entry: object) -> RemoteFile:
    """A RemoteFile from one entry of a tree listing (``path``, ``size``, ``oid``, ``lfs.oid``), checked."""
    if not isinstance(entry, dict):
        raise ValueError(f"a tree entry is not an object: {entry!r:.80}")
    lfs = entry.get("lfs") or None
    return remote_file(endpoint, repo_id, "tree listing", entry["path"], entry.get("size"), entry.get("oid"),
                       lfs.get("oid") if isinstance(lfs, dict) else None)


def remote_file(endpoint: str, repo_id: str, source: str, path: str, size: object, blob_id: object,
                lfs_sha256: object) -> RemoteFile:
    """A RemoteFile from untrusted fields: a safe path, a size from 0 to :data:`hfcache.records.MAX_FILE_SIZE` (an
    int, not a bool), 40/64 lowercase hex ids, else HubError (exit 3) naming the file and the value."""
    path = safe_path(repo_id, path, endpoint)
    if not valid_size(size):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave no valid size for {path} ({shown(size)}; sizes are "
                       f"integers from 0 to {MAX_FILE_SIZE})",
                       hint="the endpoint must publish sizes like the Hub (docs/cache-layout.md, 'The Hub protocol')")
    if lfs_sha256 is not None and not (isinstance(lfs_sha256, str) and SHA256_RE.fullmatch(lfs_sha256)):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave sha256 {shown(lfs_sha256)} for {path}, "
                       "not 64 lowercase hex characters", hint="the endpoint is broken or hostile")
    if lfs_sha256 is None and not (isinstance(blob_id, str) and BLOB_ID_RE.fullmatch(blob_id)):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave blob id {shown(blob_id)} for {path}, "
                       "not 40 or 64 lowercase hex characters", hint="the endpoint is broken or hostile")
    return RemoteFile(path=path, size=size, blob_id=blob_id if isinstance(blob_id, str) else "",
                      lfs_sha256=lfs_sha256)


def safe_path(repo_id: str, path: object, endpoint: str | None = None) -> str:
    """``path`` as a safe repo path (:func:`hfcache.records.validate_repo_path`: no escape, within the folder and
    name bounds), else HubError naming it and ``endpoint`` (exit 3, before anything is downloaded)."""
    try:
        if not isinstance(path, str):
            raise UnsafePath(f"unsafe repo file path {path!r:.200}")
        return validate_repo_path(path)
    except UnsafePath as exc:
        who = f"endpoint {endpoint}" if endpoint else "endpoint"
        raise HubError(f"{repo_id}: {who} listed an {exc}", hint="the endpoint is broken or hostile") from None


def file_and_folder(paths: set[str]) -> str | None:
    """A path of ``paths`` that is also a folder of another (``a`` and ``a/b``): no cache can hold both."""
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                return "/".join(parts[:i])
    return None


def error_document(content: bytes, content_type: str = "") -> bytes:
    """An error answer's body (read at most 64 KiB) rebuilt as the JSON object ``hf_raise_for_status`` reads its
    message from: the string (or strings) of ``error``, the string ``error_description``, the string ``message`` of
    each object in ``errors``; a body that is a JSON string, or not JSON (and not HTML), becomes ``error``.

    Library gap: ``hf_raise_for_status`` (huggingface_hub ``utils/_http.py`` ``_format``) reads ``response.json()``
    as an object: an error body that is a JSON array, string, number or ``null`` raised AttributeError there, an
    ``errors`` that is not a list of objects TypeError, undecodable bytes UnicodeDecodeError, deep nesting
    RecursionError; each left the command as an internal error (exit 70) instead of the status's own error.

    Args:
        content (bytes): the body as read. content_type (str): the answer's ``Content-Type``.

    Returns:
        bytes: a JSON object of those fields only (``{}`` when none), ASCII.
    """
    text = content.decode("utf-8", "replace")
    try:
        doc = loads_json(text, "an error answer")
    except TooDeep:
        doc = None
    except ValueError:  # not JSON: shown as text, as huggingface_hub shows it (not an HTML page)
        doc = text if "html" not in content_type.lower() else None
    if isinstance(doc, str):
        doc = {"error": doc}
    kept: dict[str, object] = {}
    if isinstance(doc, dict):
        error, description, errors = doc.get("error"), doc.get("error_description"), doc.get("errors")
        if isinstance(error, list):
            error = [e for e in error if isinstance(e, str)]
        if isinstance(error, (str, list)) and error:
            kept["error"] = error
        if isinstance(description, str):
            kept["error_description"] = description
        if isinstance(errors, list):
            kept["errors"] = [{"message": e["message"]} for e in errors
                              if isinstance(e, dict) and isinstance(e.get("message"), str)]
    return json.dumps(kept).encode()
