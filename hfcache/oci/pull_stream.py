"""What ``hfcache pull`` reads from a registry, checked as it streams: the byte budget (``--max-size``, free space),
hashing readers that refuse more than a declared size, manifests and configs read under a cap and their digest.

Both formats use them: the image format's tar layers (:mod:`hfcache.oci.pull`) and ModelPack's raw layers
(:mod:`hfcache.oci.pull_modelpack`). JSON a registry sends is read with :func:`hfcache.bounds.loads_json` (nesting
bounded: a manifest nested too deep is exit 2, never a RecursionError).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import BinaryIO

from ..bounds import TooDeep, loads_json
from ..errors import CacheError, EndpointUnreachable, HubError, IntegrityError, UsageError
from .registry import DIGEST, TransferSink, check, read_body

_MAX_JSON = 4 * 1024 * 1024  # a manifest or config larger than this is not one of ours (or not one at all)
_CHUNK = 1024 * 1024
_ALTERED = "the registry content was altered or is corrupt; nothing was imported"


class Budget:
    """The bytes a pull may unpack, and download: ``max_size`` (exit 2) and the free space on the cache's
    filesystem when the pull started (exit 5). Every layer's tar stream counts (``used``), and an entry is refused
    before it is staged; the compressed bytes count on their own (``wire``: a gzip layer is never smaller than its
    tar, except for a stream of empty gzip members, which inflates to nothing and would otherwise be read forever)."""

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
    """Reads ``source``, hashing every byte; refuses more than ``limit`` bytes (a blob larger than declared) and
    more than the ``budget``. Errors of ``source`` become hfcache errors naming the layer: ``network`` errors
    (urllib3's, sockets') exit 3 as unreachable, ``corrupt`` ones (gzip's, zlib's) exit 3 as altered content."""

    def __init__(self, source, what: str, *, limit: int | None = None, sink: TransferSink | None = None,
                 budget: Budget | None = None, wire: bool = False, network: tuple = (), corrupt: tuple = ()) -> None:
        self._source, self._what, self._limit, self._sink, self._budget = source, what, limit, sink, budget
        self._wire, self._network, self._corrupt = wire, network, corrupt
        self.sha256, self.size = hashlib.sha256(), 0

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
        buffer[:n] = data
        self.size += n
        if self._limit is not None and self.size > self._limit:
            raise IntegrityError(f"refused layer {self._what}: larger than the {self._limit} bytes its manifest "
                                 "declares", hint=_ALTERED)
        if self._budget is not None:
            self._budget.take(n, f"layer {self._what}", wire=self._wire)
        self.sha256.update(data)
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


def get_json(client, container, address: str, what: str, accept: str,
              expected_digest: str | None) -> tuple[dict, bytes, str | None]:
    """GET a manifest or config (at most ``_MAX_JSON`` bytes) checked against ``expected_digest``.

    Returns:
        (document, body, media type of the answer).
    """
    response = client.do_request(address, "GET", headers={"Accept": accept}, stream=True)
    with response:
        if response.status_code == 404:
            raise HubError(f"{what}: not found in {container.registry}/{container.api_prefix}",
                           hint="check the name and the tag or digest (`skopeo list-tags docker://REGISTRY/NAME`)")
        check(response, what, 200)
        body = read_body(response, _MAX_JSON + 1, container.registry)
        answered = response.headers.get("Docker-Content-Digest")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip() or None
    if len(body) > _MAX_JSON:
        raise UsageError(f"{what}: larger than {_MAX_JSON} bytes; not an hfcache image",
                         hint="pull images written by `hfcache push`")
    expected = expected_digest or (answered if answered and DIGEST.fullmatch(answered) else None)
    if expected and sha256_of(body) != expected:
        raise IntegrityError(f"{what}: content does not match its digest {expected}", hint=_ALTERED)
    try:
        document = loads_json(body, what)  # bounded nesting (bounds.MAX_JSON_DEPTH): TooDeep, never a 70
    except TooDeep:
        raise UsageError(f"{what}: JSON nested too deep; not an hfcache image",
                         hint="pull images written by `hfcache push`") from None
    except (ValueError, RecursionError):
        raise UsageError(f"{what}: not JSON", hint="pull images written by `hfcache push`") from None
    if not isinstance(document, dict):
        raise UsageError(f"{what}: not a JSON object", hint="pull images written by `hfcache push`")
    return document, body, media_type


def sha256_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def free_space(cache_dir: Path) -> tuple[int, Path]:
    """Free bytes on the filesystem that holds (or will hold) ``cache_dir``: its nearest existing folder's."""
    from ..move.import_staging import free_bytes

    folder = cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return free_bytes(folder), folder

