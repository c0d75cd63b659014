"""``hfcache push``'s blob upload: the distribution API's monolithic upload ("POST then PUT"), the body streamed
from a file under the throughput floor (:func:`hfcache.pace.min_rate`), through :mod:`hfcache.oci.registry`."""

from __future__ import annotations

import io
from pathlib import Path

from ..errors import HubError
from ..pace import Throughput, min_rate
from .registry import TransferSink, check, url

_CHUNK = 1024 * 1024


class _ProgressFile(io.RawIOBase):
    """A file read for an upload body, reporting progress (requests streams a file object with Content-Length)."""

    def __init__(self, path: Path, sink: TransferSink | None) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._sink = sink
        self.sent = 0
        self._floor = Throughput(*min_rate(), f"upload of {path.name}")  # a registry reading 1 B/s: TooSlow

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(_CHUNK if size is None or size < 0 else size)
        self._floor.feed(len(data))
        self.sent += len(data)
        if self._sink is not None and data:
            self._sink.advance(len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.sent = 0
        self._floor = Throughput(self._floor.rate, self._floor.window, self._floor.what)
        return self._f.seek(offset, whence)

    def close(self) -> None:
        self._f.close()
        super().close()


def upload(client, container, digest: str, path: Path, size: int, sink: TransferSink | None, label: str) -> int:
    """Upload one blob unless the registry has it (HEAD); return the bytes sent.

    The monolithic upload of distribution-spec ("POST then PUT"): the body is streamed from the file.

    Raises:
        RegistryAuthError, HubError: the registry refused.
        pace.TooSlow: the registry took the body below the floor (``network_errors`` makes it EndpointUnreachable).
    """
    head = client.do_request(url(client, container, "blobs", digest), "HEAD")
    if head.status_code == 200:
        return 0
    started = client.do_request(f"{client.prefix}://{container.upload_blob_url()}", "POST",
                                headers={"Content-Length": "0"})
    check(started, f"start upload to {container.registry}/{container.api_prefix}", 202)
    location = client._get_location(started, container)  # oras: makes a relative Location absolute
    if not location:
        raise HubError(f"registry {container.registry}: no upload location in its answer",
                       hint="the registry does not speak the distribution API's blob upload")
    separator = "&" if "?" in location else "?"
    if sink is not None:
        sink.begin(label, size)
    with _ProgressFile(path, sink) as body:
        done = client.do_request(f"{location}{separator}digest={digest}", "PUT", data=body,
                                 headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        check(done, f"upload {digest}", 201, 204)
        return body.sent
