"""Blob uploads for ``hfcache push``: monolithic (POST, then PUT ``?digest=``; distribution-spec v1.1 "Pushing
blobs") or a cross-repository mount, the body streamed under the throughput floor (oras-py's uploads read a path
whole and check nothing: docs/oci.md "Why oras-py"; only its ``_get_location`` is reused).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import PurePosixPath

from ..cache.content import SHA256, BlobHash
from ..errors import CacheError, HubError
from ..pace import Throughput, min_rate
from .peer import digest_of
from .registry import TransferSink, check, url

_CHUNK = 1024 * 1024


class UploadBody(io.RawIOBase):
    """An upload body: the file ``opener()`` gives, read under the throughput floor, progress to ``sink``;
    ``seek(0)`` (a redirect's resend) opens it again. With ``verify``, its bytes must be the ``size`` bytes of
    ``digest``, else CacheError naming ``shown`` (the upload never completes)."""

    def __init__(self, opener: Callable[[], io.BufferedIOBase], digest: str, size: int, shown: str,
                 sink: TransferSink | None = None, verify: bool = False) -> None:
        self._opener, self._digest, self._size, self._shown = opener, digest, size, shown
        self._sink, self._verify, self._f = sink, verify, None
        self.seek(0)

    def readable(self) -> bool:
        return True

    def __len__(self) -> int:  # requests' super_len: the body's length (with tell), not a chunked upload
        return self._size

    def tell(self) -> int:
        return self.sent

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset != 0 or whence != 0:
            raise io.UnsupportedOperation("an upload body only starts over")
        if self._f is not None:
            self._f.close()
        self._f = self._opener()
        self._hash, self.sent = BlobHash(SHA256) if self._verify else None, 0
        self._floor = Throughput(*min_rate(), f"upload of {PurePosixPath(self._shown).name}")  # a 1 B/s reader
        return 0

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(_CHUNK if size is None or size < 0 else min(size, _CHUNK))
        self.sent += len(data)
        self._floor.feed(len(data))
        if self._hash is not None:
            self._hash.update(data)
        if self._hash is not None and (self.sent > self._size or (not data and (
                self.sent != self._size or f"sha256:{self._hash.hexdigest()}" != self._digest))):
            raise CacheError(f"{self._shown}: its bytes are not the {self._size} bytes of {self._digest[:19]}... "
                             "(corrupt, or changed while it was pushed): the push stopped, no manifest written",
                             hint="run `hfcache verify --repair` on the cache, then push again")
        if self._sink is not None and data:
            self._sink.advance(len(data))
        return data

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        super().close()


def _location(client, container, started) -> str:
    """The upload's ``Location`` made absolute by oras's private ``Registry._get_location``; HubError: none."""
    location = client._get_location(started, container)  # the library gap above
    if not location:
        raise HubError(f"registry {container.registry}: no upload location in its answer",
                       hint="the registry does not speak the distribution API's blob upload")
    return location


def upload(client, container, digest: str, size: int, opener: Callable[[], io.BufferedIOBase], *, shown: str = "",
           sink: TransferSink | None = None, label: str = "", verify: bool = False, mount_from: str = "",
           what: str = "") -> int:
    """Make ``digest`` a blob of ``container``'s repository unless the registry has it (HEAD): mounted from the
    repository ``mount_from`` when given and the registry mounts (201), else uploaded from ``opener()``
    (:class:`UploadBody`; ``shown`` names it, ``label`` is its progress line). Returns the bytes sent.

    Raises:
        CacheError: with ``verify``, the bytes are not ``digest`` (exit 5). RegistryAuthError, HubError: the registry
            refused (``what`` names the PUT). pace.TooSlow: below the throughput floor (``registry.network_errors``).
    """
    if client.do_request(url(client, container, "blobs", digest), "HEAD").status_code == 200:
        return 0
    address = f"{client.prefix}://{container.upload_blob_url()}"
    if mount_from:
        started = client.do_request(f"{address}?mount={digest}&from={mount_from}", "POST",
                                    headers={"Content-Length": "0"})
        if started.status_code == 201:
            return 0
        check(started, f"mount {digest} from {mount_from}", 202)
    else:
        started = client.do_request(address, "POST", headers={"Content-Length": "0"})
        check(started, f"start upload to {container.registry}/{container.api_prefix}", 202)
    location = _location(client, container, started)
    if sink is not None:
        sink.begin(label, size)
    with UploadBody(opener, digest, size, shown or label, sink, verify) as body:
        done = client.do_request(f"{location}{'&' if '?' in location else '?'}digest={digest}", "PUT", data=body,
                                 headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        check(done, what or f"upload {digest}", 201, 204)
        return body.sent


def upload_bytes(client, container, data: bytes, label: str, what: str = "") -> int:
    """:func:`upload` of ``data`` (a config, a ref, a signature bundle); the bytes sent."""
    return upload(client, container, digest_of(data), len(data), lambda: io.BytesIO(data), label=label, what=what)
