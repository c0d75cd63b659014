"""The bucket layout, content-addressed (docs/fleet.md, "The bucket layout")::

    <prefix>/blobs/<etag>                       a blob, named as the cache names it (sha256 or git-sha1, 40/64 hex)
    <prefix>/snapshots/<folder>/<commit>.json   a snapshot manifest: a lock entry (hfcache.lock's schema, as JSON)
    <prefix>/refs/<folder>/<ref>                the 40-hex commit a ref names

``<folder>`` is the cache's repo folder name (``models--ORG--NAME``). A push writes blobs, then manifests, then refs:
whoever finds a ref finds its manifest, and every blob a manifest names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import HubError, UsageError
from ..names import is_commit, parse_folder_name, repo_folder_name
from ..records import WarmRequest
from ..warming.lockfile import LockedFile, LockedRepo, lock_entry, locked_repo
from .store import BucketUrl

FORMAT = "hfcache-bucket-snapshot/1"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024  #: a snapshot manifest's largest size (a million files at ~60 bytes each)
MAX_REF_BYTES = 64
_HOSTILE = "the bucket is corrupt or was written by something else than hfcache push; push it again"


def blob_key(url: BucketUrl, etag: str) -> str:
    return url.key("blobs", etag)


def snapshot_key(url: BucketUrl, folder: str, commit: str) -> str:
    return url.key("snapshots", folder, f"{commit}.json")


def ref_key(url: BucketUrl, folder: str, ref: str) -> str:
    return url.key("refs", folder, ref)


def snapshot(folder: str, commit: str, files: Sequence[LockedFile], absent: Sequence[str] = (),
             revision: str | None = None) -> LockedRepo:
    """The snapshot ``commit`` of the cache folder ``folder`` as a locked repo (revision: ``revision``, else the
    commit; every file, kind ``all``). Raises UsageError: ``folder`` is not a repo folder name."""
    parsed = parse_folder_name(folder)
    if parsed is None:
        raise UsageError(f"{folder!r} is not a repo folder name")
    repo_id, repo_type = parsed
    request = WarmRequest(repo_id, revision=revision or commit, repo_type=repo_type, kind="all")
    return LockedRepo(request=request, canonical_id=repo_id, commit_hash=commit,
                      files=tuple(sorted(files, key=lambda f: f.path)), absent=tuple(sorted(absent)))


def render_manifest(repo: LockedRepo) -> bytes:
    """A snapshot manifest's bytes: canonical JSON (sorted keys), so the same snapshot always gives the same object."""
    return json.dumps({"format": FORMAT, **lock_entry(repo)}, sort_keys=True, separators=(",", ":")).encode()


def parse_manifest(data: bytes, folder: str, commit: str, revision: str, where: str) -> LockedRepo:
    """The manifest stored at ``snapshots/<folder>/<commit>.json`` (``where`` names it), checked as a lock entry is
    and against its key, as a locked repo requesting ``revision``. Raises HubError (exit 3): not JSON, another format,
    a malformed entry, or a repo or commit other than its key's."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise HubError(f"{where}: not a JSON document", hint=_HOSTILE) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise HubError(f"{where}: not a {FORMAT} manifest", hint=_HOSTILE)
    document.pop("format")
    try:
        repo = locked_repo(document, where)
    except UsageError as exc:
        raise HubError(exc.message, hint=_HOSTILE) from None
    if clash := sorted({f.path for f in repo.files} & set(repo.absent)):
        raise HubError(f"{where}: {clash[0]!r} is both a file and absent", hint=_HOSTILE)
    named = repo_folder_name(repo.request.repo_id, repo.request.repo_type)
    if named != folder or repo.commit_hash != commit or repo.canonical_id != repo.request.repo_id:
        raise HubError(f"{where}: the manifest is about {named}@{repo.commit_hash[:12]}, not its key's "
                       f"{folder}@{commit[:12]}", hint=_HOSTILE)
    return snapshot(folder, commit, repo.files, repo.absent, revision)


def parse_ref(data: bytes, where: str) -> str:
    """A ref object's commit. Raises HubError (exit 3): not 40 hex (a trailing newline is allowed)."""
    text = data.decode("ascii", "replace").strip()
    if not is_commit(text):
        raise HubError(f"{where}: not a 40-hex commit", hint=_HOSTILE)
    return text
