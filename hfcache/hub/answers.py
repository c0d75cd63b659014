"""An endpoint's answers, read as untrusted input: the repo info fields hfcache reads, tree entries, and every
id, path and size checked before it is used.

Every id parsed from an answer is validated (commit 40 hex, blob ids 40/64 lowercase hex, safe paths) and a source
that gives no hash or size for a file is an error naming the file: hash checks stay mandatory. Standard library and
hfcache's records only: the requests themselves are :mod:`hfcache.hub.client`'s.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import HubError
from ..records import UnsafePath, valid_repo_id, validate_repo_path
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
                raise TypeError(f"lfs of {entry['rfilename']!r:.80} is not an object")
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
        raise HubError(f"{repo_id}: {endpoint} answered an invalid repo id {canonical_id!r}",
                       hint="the endpoint is broken or hostile")
    if not COMMIT_RE.fullmatch(commit):
        raise HubError(f"{repo_id}: {endpoint} answered commit {commit!r}, not 40 hex characters",
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
        raise HubError(f"{repo_id}: asked for commit {revision}, {endpoint} answered commit {commit!r}",
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
        raise HubError(f"{repo.repo_id}: endpoint listed {clash!r} as a file and as a folder",
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
    """A RemoteFile from untrusted fields: a safe path, a size >= 0, 40/64 lowercase hex ids, else HubError."""
    path = safe_path(repo_id, path, endpoint)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise HubError(f"{repo_id}: {source} at {endpoint} gave no valid size for {path} ({size!r})",
                       hint="the endpoint must publish sizes like the Hub (docs/cache-layout.md, 'The Hub protocol')")
    if lfs_sha256 is not None and not (isinstance(lfs_sha256, str) and SHA256_RE.fullmatch(lfs_sha256)):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave sha256 {lfs_sha256!r} for {path}, "
                       "not 64 lowercase hex characters", hint="the endpoint is broken or hostile")
    if lfs_sha256 is None and not (isinstance(blob_id, str) and BLOB_ID_RE.fullmatch(blob_id)):
        raise HubError(f"{repo_id}: {source} at {endpoint} gave blob id {blob_id!r} for {path}, "
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
