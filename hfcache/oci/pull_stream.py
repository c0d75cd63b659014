"""What ``hfcache pull`` reads from a registry, checked as it streams, for both formats (:mod:`.pull`,
:mod:`.pull_modelpack`): the byte budget (``--max-size``, free space), hashing readers that refuse more than a
declared size, manifests and configs read under a size cap (JSON nesting bounded) and checked against their digest.
"""

from __future__ import annotations

import errno
import io
import tarfile
from pathlib import Path
from typing import BinaryIO

from ..bounds import TooDeep, loads_json
from ..cache import safefs
from ..cache.content import GIT_SHA1, SHA256, BlobHash, algorithm_of, hash_fd
from ..errors import CacheError, CheckFailed, EndpointUnreachable, HubError, IntegrityError, UsageError
from ..move.import_plan import MAX_REF_BYTES
from ..names import is_commit, is_oci_digest
from .peer import digest_of
from .registry import TransferSink, get_bounded

_MAX_JSON = 4 * 1024 * 1024  # a manifest or config larger than this is not one of ours (or not one at all)
#: Most layers a pull reads, in either format (one request each): a 4 MiB manifest holds about that many descriptors.
MAX_LAYERS = 10_000
_CHUNK = 1024 * 1024
_ALTERED = "the registry content was altered or is corrupt; nothing was imported"
_OURS = "pull images written by `hfcache push`"


class Budget:
    """The bytes a pull may unpack (``used``) and download (``wire``: a stream of empty gzip members inflates to
    nothing): ``max_size`` (exit 2) and the free space on the cache's filesystem when the pull started (exit 5)."""

    def __init__(self, max_size: int | None, free: int, where: Path) -> None:
        self.max_size, self.free, self.where, self.used, self.wire = max_size, free, where, 0, 0

    def check(self, more: int, what: str, *, wire: bool = False) -> None:
        total, verb = (self.wire + more, "downloads") if wire else (self.used + more, "unpacks to")
        if self.max_size is not None and total > self.max_size:
            raise UsageError(f"refused {what}: the image {verb} more than --max-size ({self.max_size} bytes); "
                             "nothing was imported", hint="raise --max-size if you trust this image")
        if total > self.free:
            raise CacheError(f"refused {what}: the image {verb} more than the {self.free} bytes free on "
                             f"{self.where}'s filesystem; nothing was imported",
                             hint="free disk space or pull into another --cache-dir")

    def take(self, n: int, what: str, *, wire: bool = False) -> None:
        self.check(n, what, wire=wire)
        if wire:
            self.wire += n
        else:
            self.used += n


class VerifiedStream(io.RawIOBase):
    """Reads ``source``, hashing every byte (sha256; and ``git``, the git blob sha1, for an ``etag`` that is one);
    refuses more than ``limit`` bytes, with ``exact`` fewer too (the first bytes kept in ``head``: a ref's commit),
    and more than the ``budget``. ``network`` errors of ``source`` exit 3 as unreachable, ``corrupt`` ones as
    altered content."""

    def __init__(self, source, what: str, *, limit: int | None = None, sink: TransferSink | None = None,
                 budget: Budget | None = None, wire: bool = False, network: tuple = (), corrupt: tuple = (),
                 exact: bool = False, etag: str = "") -> None:
        self._source, self._what, self._limit, self._sink, self._budget = source, what, limit, sink, budget
        self._wire, self._network, self._corrupt, self._exact = wire, network, corrupt, exact
        self.sha256, self.size, self.head = BlobHash(SHA256), 0, bytearray()
        self.git = BlobHash(GIT_SHA1, limit) if is_commit(etag) else None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._source.read(len(buffer))
        except self._network as exc:
            raise EndpointUnreachable(f"layer {self._what}: the download failed ({type(exc).__name__})",
                                      hint="check the registry and try again; nothing was imported") from None
        except self._corrupt as exc:
            raise IntegrityError(f"refused layer {self._what}: not a readable tar+gzip ({type(exc).__name__})",
                                 hint=_ALTERED) from None
        n = len(data)
        if n == 0 and self._exact and self.size < self._limit:
            raise IntegrityError(f"refused layer {self._what}: the registry sent {self.size} bytes, its manifest "
                                 f"declares {self._limit}", hint=_ALTERED)
        buffer[:n] = data
        self.size += n
        if self._limit is not None and self.size > self._limit:
            raise IntegrityError(f"refused layer {self._what}: larger than the {self._limit} bytes its manifest "
                                 "declares", hint=_ALTERED)
        if self._budget is not None:
            self._budget.take(n, f"layer {self._what}", wire=self._wire)
        self.sha256.update(data)
        if self.git is not None:
            self.git.update(data)
        if self._exact and len(self.head) < MAX_REF_BYTES:  # plan_artifact bounds a ref's size to this
            self.head += data[:MAX_REF_BYTES - len(self.head)]
        if self._sink is not None and n:
            self._sink.advance(n)
        return n

    def digest(self) -> str:
        return f"sha256:{self.sha256.hexdigest()}"


class Entry(io.RawIOBase):
    """An entry's content as the importer reads it; a tar that breaks mid-entry is the layer's fault (exit 3)."""

    def __init__(self, stream: BinaryIO, what: str) -> None:
        self._stream, self._what = stream, what

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except (tarfile.TarError, EOFError) as exc:
            raise IntegrityError(f"refused layer {self._what}: its tar ends inside an entry ({exc})",
                                 hint=_ALTERED) from None


def check_layer_count(count: int, reference: str, hint: str) -> None:
    if count > MAX_LAYERS:
        raise UsageError(f"{reference}: {count} layers, more than the {MAX_LAYERS} hfcache pulls", hint=hint)


def get_json(client, container, address: str, what: str, accept: str,
              expected_digest: str | None) -> tuple[dict, bytes, str | None]:
    """(document, body, media type) of the manifest or config at ``address`` (bounded), checked against
    ``expected_digest``, else the registry's ``Docker-Content-Digest``."""
    body, media_type, headers = get_bounded(client, address, accept, _MAX_JSON, what)
    if body is None:
        raise HubError(f"{what}: not found in {container.registry}/{container.api_prefix}",
                       hint="check the name and the tag or digest (`skopeo list-tags docker://REGISTRY/NAME`)")
    answered = headers.get("Docker-Content-Digest")
    if len(body) > _MAX_JSON:
        raise UsageError(f"{what}: larger than {_MAX_JSON} bytes; not an hfcache image", hint=_OURS)
    expected = expected_digest or (answered if is_oci_digest(answered) else None)
    if expected and digest_of(body) != expected:
        raise IntegrityError(f"{what}: content does not match its digest {expected}", hint=_ALTERED)
    try:
        document = loads_json(body, what)
    except TooDeep:
        raise UsageError(f"{what}: JSON nested too deep; not an hfcache image", hint=_OURS) from None
    except (ValueError, RecursionError):
        raise UsageError(f"{what}: not JSON", hint=_OURS) from None
    if not isinstance(document, dict):
        raise UsageError(f"{what}: not a JSON object", hint=_OURS)
    return document, body, media_type or None


def free_space(cache_dir: Path) -> tuple[int, Path]:
    """Free bytes on the filesystem that holds (or will hold) ``cache_dir``: its nearest existing folder's."""
    from ..move.import_staging import free_bytes

    folder = cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return free_bytes(folder), folder


def changed_on_disk(shown: str, says: str = "its name says") -> CheckFailed:
    """The refusal of a target file whose bytes are not what its blob name says (exit 1, nothing changed)."""
    return CheckFailed(f"refused the pull, nothing was changed: the target's {shown} does not hold the content "
                       f"{says} (changed on disk)",
                       hint="run `hfcache verify` on the target and remove that blob, then pull again")


def rehashed(cache_dir: Path, folder: str, etag: str, says: str = "its name says") -> tuple[dict[str, str], int] | None:
    """({algorithm: hex} of ``etag``'s algorithm and sha256, size) of the target's ``<folder>/blobs/<etag>``, read
    once through :func:`hfcache.cache.safefs.open_blob`; None when there is no regular file opened safely.
    Raises CheckFailed: its bytes are not its name's (:func:`changed_on_disk` with ``says``); OSError."""
    try:
        fd = safefs.open_blob(cache_dir, folder, etag)
    except (OSError, CacheError):
        return None
    algorithm = algorithm_of(etag)
    try:
        digests, size = hash_fd(fd, tuple(dict.fromkeys((algorithm or SHA256, SHA256))), shown=f"{folder}/blobs/{etag}")
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    if algorithm is not None and digests[algorithm] != etag:
        raise changed_on_disk(f"{folder}/blobs/{etag}", says)
    return digests, size


def held_locally(cache_dir: Path, folder: str, etag: str, size: int, digest: str | None = None) -> bool:
    """Whether the target already holds the blob ``<folder>/blobs/<etag>`` of ``size`` bytes (:func:`rehashed`)
    and, with ``digest`` (a raw layer's ``sha256:<hex>``), that layer's bytes.

    Raises:
        CheckFailed: the blob does not hash to its name (exit 1). IntegrityError: it is not the layer's content.
    """
    held = rehashed(cache_dir, folder, etag)
    if held is None:
        return False
    digests, held_size = held
    if held_size != size or (digest is not None and f"sha256:{digests[SHA256]}" != digest):
        shown = f" ({digest})" if digest else ""
        raise IntegrityError(f"refused the pull, nothing was changed: a layer{shown} names {folder}/blobs/{etag} as "
                             "its blob, which holds other bytes (the blob name the artifact gives does not match its "
                             "content)", hint="the artifact is altered or crafted; pull it from its source again")
    return True
