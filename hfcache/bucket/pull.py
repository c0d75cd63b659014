"""``hfcache pull s3://BUCKET/PREFIX``: snapshots from a bucket into a cache with ``warm --lock``'s engine. Each
snapshot manifest is a lock entry (:mod:`.layout`), so the pull *is* a warm of pinned repos whose file bodies come from
the bucket: blobs the cache holds are not fetched, large ones arrive in parallel ranged GETs, every byte is hashed
before it is published, a killed pull resumes from the bytes on disk (:mod:`hfcache.hub.transfer`), and a repo becomes
visible (snapshot, then ref) only when all its blobs are in place.

Each GET goes to a presigned URL of ``blobs/<etag>`` (signed locally by botocore, valid
:data:`hfcache.bucket.store.PRESIGN_SECONDS`) through :class:`hfcache.hub.bodies_client.BodiesClient`: the engine's HTTP
client never holds a credential, and no URL is shown.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..errors import HfcacheError, HubError, RepoNotFound, RevisionNotFound, UsageError
from ..hub.bodies_client import BodiesClient
from ..names import check_ref_name, is_commit, parse_folder_name, repo_folder_name
from ..records import REPO_TYPES, HubOptions, WarmReport, WarmRequest
from ..warming.lockfile import LockedRepo, Lockfile
from .layout import MAX_MANIFEST_BYTES, MAX_REF_BYTES, blob_key, parse_manifest, parse_ref, ref_key, snapshot_key
from .store import Bucket, parse_bucket_url

_GONE = "the bucket lost an object its manifest names (or it was deleted): push the repo again"


def pull_bucket(url: str, cache_dir: str | os.PathLike[str] | None, specs: Iterable[str] = (), *,
                hub: HubOptions | None = None, progress=None, lock_timeout: float = 10.0,
                on_lock_wait=None) -> WarmReport:
    """Pull from the bucket at ``url`` the repos ``specs`` name (``REPO_ID[@REVISION]``: a ref or a commit of the
    bucket; without ``@`` every ref and snapshot of the repo; no spec: everything) into ``cache_dir``, as warm does
    (``hub``: timeout, retries and connections; its endpoints and token are not used). Returns warm's report, one
    RepoResult per (repo, ref) and per snapshot no ref names.

    Raises:
        UsageError: a bad URL or spec, no boto3 or credentials (exit 2). RepoNotFound/RevisionNotFound: a repo or
        revision the bucket does not hold (exit 3). HubError: the store failed, a manifest or ref is malformed (exit 3).
        CacheError: the cache cannot be written (exit 5). A repo whose blobs fail is a failed result, not raised.
    """
    from ..hub.session import prepare_session
    from ..warming.run import warm_lock

    hub = hub or HubOptions()
    bucket = Bucket(parse_bucket_url(url), timeout=hub.timeout, retries=hub.retries, max_workers=hub.max_workers)
    lock = Lockfile(repos=tuple(plan_pull(bucket, specs)))
    prepare_session()
    client = BodiesClient(str(bucket.url), lambda etag: bucket.presigned_get(blob_key(bucket.url, etag)),
                          timeout=hub.timeout, retries=hub.retries, missing_hint=_GONE)
    return warm_lock(lock, hub, cache_dir=cache_dir, progress=progress, lock_timeout=lock_timeout,
                     on_lock_wait=on_lock_wait, clients=[client])


def plan_pull(bucket: Bucket, specs: Iterable[str]) -> list[LockedRepo]:
    """The locked repos a pull of ``specs`` warms (see :func:`pull_bucket`), each manifest read and checked once."""
    refs, snapshots = _listing(bucket)
    wanted: list[tuple[str, str, str]] = []  # (folder, commit, revision)
    specs = list(specs)
    for spec in specs:
        request = WarmRequest.parse(spec)
        folder = _folder_of(bucket, request.repo_id, snapshots)
        if "@" not in spec:
            wanted += _everything(folder, refs, snapshots)
        elif request.revision in refs.get(folder, {}):
            wanted.append((folder, refs[folder][request.revision], request.revision))
        elif is_commit(request.revision) and request.revision in snapshots[folder]:
            wanted.append((folder, request.revision, request.revision))
        else:
            raise RevisionNotFound(f"{bucket.url}: {request.repo_id} has no ref or snapshot {request.revision!r}",
                                   hint=f"the bucket holds: {', '.join(sorted(refs.get(folder, {}))) or 'no ref'}")
    if not specs and not snapshots:
        raise RepoNotFound(f"{bucket.url}: the bucket holds no snapshot under this prefix",
                           hint="check the bucket and prefix (push s3://... writes snapshots/, blobs/ and refs/)")
    if not specs:
        for folder in sorted(snapshots):
            wanted += _everything(folder, refs, snapshots)
    manifests: dict[tuple[str, str], bytes] = {}
    pinned = []
    for folder, commit, revision in dict.fromkeys(wanted):
        key = snapshot_key(bucket.url, folder, commit)
        if (folder, commit) not in manifests:
            if commit not in snapshots.get(folder, ()):
                raise HubError(f"{bucket.url}: ref {folder}/{revision} names {commit[:12]}, which has no manifest",
                               hint=_GONE)
            manifests[(folder, commit)] = bucket.get_bytes(key, MAX_MANIFEST_BYTES)
        pinned.append(parse_manifest(manifests[(folder, commit)], folder, commit, revision, key))
    return pinned


def _folder_of(bucket: Bucket, repo_id: str, snapshots: dict[str, set[str]]) -> str:
    """The bucket's folder of ``repo_id``, of whichever repo type it holds. Raises RepoNotFound: none;
    UsageError: several types (a model and a dataset of the same id)."""
    found = [f for f in (repo_folder_name(repo_id, t) for t in REPO_TYPES) if f in snapshots]
    if not found:
        raise RepoNotFound(f"{bucket.url}: no snapshot of {repo_id}", hint="check the repo id; push it first")
    if len(found) > 1:
        raise UsageError(f"{bucket.url}: {repo_id} is held as {' and '.join(found)}",
                         hint="pull without repo ids to take both")
    return found[0]


def _everything(folder: str, refs: dict[str, dict[str, str]], snapshots: dict[str, set[str]]) -> list:
    """Every ref of ``folder``, then every snapshot no ref names (its commit as the revision)."""
    named = refs.get(folder, {})
    return ([(folder, commit, ref) for ref, commit in sorted(named.items())]
            + [(folder, c, c) for c in sorted(snapshots[folder] - set(named.values()))])


def _listing(bucket: Bucket) -> tuple[dict[str, dict[str, str]], dict[str, set[str]]]:
    """The bucket's refs (folder -> ref -> commit, each ref read) and snapshots (folder -> commits). Raises HubError:
    a key that is not the layout's (a foreign object under the prefix is refused, not guessed at)."""
    snapshots: dict[str, set[str]] = {}
    for rel, _size in bucket.list_keys("snapshots"):
        parts = rel.split("/")
        commit = parts[-1].removesuffix(".json") if len(parts) == 3 else ""
        if not is_commit(commit) or parse_folder_name(parts[1]) is None or not parts[-1].endswith(".json"):
            raise HubError(f"{bucket.url}: {rel[:120]!r} is not a snapshot manifest's key",
                           hint="keep only what hfcache push writes under the prefix")
        snapshots.setdefault(parts[1], set()).add(commit)
    refs: dict[str, dict[str, str]] = {}
    for rel, _size in bucket.list_keys("refs"):
        folder, _, ref = rel.removeprefix("refs/").partition("/")
        try:
            check_ref_name(ref)
        except HfcacheError:
            ref = ""
        if not ref or parse_folder_name(folder) is None:
            raise HubError(f"{bucket.url}: {rel[:120]!r} is not a ref's key",
                           hint="keep only what hfcache push writes under the prefix")
        key = ref_key(bucket.url, folder, ref)
        refs.setdefault(folder, {})[ref] = parse_ref(bucket.get_bytes(key, MAX_REF_BYTES), key)
    return refs, snapshots

