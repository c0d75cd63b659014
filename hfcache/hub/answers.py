"""An endpoint's answers, read as untrusted input: the repo info fields hfcache reads, tree entries, error bodies.
A bad id, path, hash, size or JSON type is a :class:`HubError` (exit 3) naming the field, quoted short.
"""

from __future__ import annotations

import json
import unicodedata
from typing import NamedTuple

from ..bounds import TooDeep, loads_json
from ..errors import HubError
from ..names import NOT_INERT, is_commit, is_etag, is_sha256
from ..records import MAX_FILE_SIZE, UnsafePath, folder_clash, shown, valid_repo_id, valid_size, validate_repo_path
from .files import RemoteFile, RepoRevision


class Sibling(NamedTuple):
    """One ``siblings`` entry (hf_api.py ``RepoSibling``), unchecked."""

    rfilename: object
    size: object
    blob_id: object
    lfs_sha256: object


class RepoInfo(NamedTuple):
    """The fields of ``GET /api/{type}s/{id}/revision/{rev}?blobs=true`` read (``siblings``: None when absent)."""

    id: str | None
    sha: str | None
    siblings: list[Sibling] | None


def parse_repo_info(data: dict) -> RepoInfo:
    """The repo info fields hfcache reads, with ``ModelInfo.__init__``'s keys (hf_api.py). Raises KeyError, TypeError: a
    sibling without ``rfilename`` or not an object, ``lfs`` not an object, ``id`` or ``sha`` not a string."""
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
    """``(canonical id, commit)`` of a repo info answer for ``repo_id``: only a legacy id (no org) is renamed, as the
    Hub renames ``gpt2``. Raises HubError: an invalid repo id, or a commit that is not 40 hex."""
    commit = info.sha or ""
    canonical_id = repo_id if "/" in repo_id else info.id or repo_id
    if not valid_repo_id(canonical_id):
        raise HubError(f"{repo_id}: {endpoint} answered an invalid repo id {shown(canonical_id)}",
                       hint="the endpoint is broken or hostile")
    if not is_commit(commit):
        raise HubError(f"{repo_id}: {endpoint} answered commit {shown(commit)}, not 40 hex characters",
                       hint="the endpoint is broken or not Hub-compatible")
    return canonical_id, commit


def check_asked_commit(endpoint: str, repo_id: str, revision: str, commit: str) -> None:
    """Raise HubError (exit 3, naming both) when ``revision`` is a full commit and ``commit`` another; ``endpoint`` (or
    ``"the lock"``) is named."""
    if is_commit(revision) and commit != revision:
        raise HubError(f"{repo_id}: asked for commit {revision}, {endpoint} answered commit {shown(commit)}",
                       hint="the endpoint is broken or hostile: a full commit sha must be answered as itself")


def check_listing(endpoint: str, repo: RepoRevision, info: RepoInfo) -> None:
    """Raise HubError when a resolved repo has no file listing, or names a path as a file and as a folder."""
    if info.siblings is None and not repo.paths:
        raise HubError(f"{repo.repo_id}: {endpoint} answered no file listing (siblings) for {repo.revision}",
                       hint="the endpoint is broken or not Hub-compatible")
    if clash := folder_clash(repo.paths):
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
    """A RemoteFile from untrusted fields: a safe path, a size from 0 to :data:`hfcache.records.MAX_FILE_SIZE`, 40/64
    lowercase hex ids; else HubError (exit 3) naming the file and the value."""
    path = safe_path(repo_id, path, endpoint)
    if not valid_size(size):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave no valid size for {path} ({shown(size)}; sizes are "
                       f"integers from 0 to {MAX_FILE_SIZE})",
                       hint="the endpoint must publish sizes like the Hub (docs/cache-layout.md, 'The Hub protocol')")
    if lfs_sha256 is not None and not is_sha256(lfs_sha256):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave sha256 {shown(lfs_sha256)} for {path}, "
                       "not 64 lowercase hex characters", hint="the endpoint is broken or hostile")
    if lfs_sha256 is None and not is_etag(blob_id):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave blob id {shown(blob_id)} for {path}, "
                       "not 40 or 64 lowercase hex characters", hint="the endpoint is broken or hostile")
    return RemoteFile(path=path, size=size, blob_id=blob_id if isinstance(blob_id, str) else "",
                      lfs_sha256=lfs_sha256)


def safe_path(repo_id: str, path: object, endpoint: str | None = None) -> str:
    """``path`` as a safe repo path (:func:`hfcache.records.validate_repo_path`), else HubError naming it and
    ``endpoint``."""
    try:
        if not isinstance(path, str):
            raise UnsafePath(f"unsafe repo file path {path!r:.200}")
        return validate_repo_path(path)
    except UnsafePath as exc:
        who = f"endpoint {endpoint}" if endpoint else "endpoint"
        raise HubError(f"{repo_id}: {who} listed an {exc}", hint="the endpoint is broken or hostile") from None


def error_document(content: bytes, content_type: str = "") -> bytes:
    """An error answer's body as the JSON object ``hf_raise_for_status`` reads its message from: the string(s) of
    ``error``, ``error_description``, each ``message`` of ``errors``; a JSON string or a non-JSON, non-HTML body
    becomes ``error``. Returns ASCII bytes of a JSON object of those fields only (``{}`` when none). Library gap:
    ``hf_raise_for_status`` (``utils/_http.py`` ``_format``) reads any JSON as an object (exit 70 on anything else).
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


#: The most characters of an endpoint's own error text kept in a message.
MAX_SAID = 200


def said(server_message: object) -> str:
    """An endpoint's own error text (huggingface_hub's ``HfHubHTTPError.server_message``: the ``X-Error-Message``
    header, else the body's ``error`` fields) as one line of inert text: whitespace runs one space, any other
    character that is not inert (:data:`hfcache.names.NOT_INERT`) a ``?``, at most :data:`MAX_SAID` characters (an
    ellipsis marks the cut); ``""`` when there is none or it is not a string."""
    if not isinstance(server_message, str):
        return ""
    text = " ".join(server_message.split())
    text = "".join("?" if unicodedata.category(c) in NOT_INERT else c for c in text)
    return text if len(text) <= MAX_SAID else text[:MAX_SAID - 1] + "…"
