"""What hfcache tells a registry and takes from it, below the HTTP client (:mod:`hfcache.oci.registry`): media
types, digests and canonical JSON, the origin credentials are bound to, registry text made inert, checks of the
values a registry's JSON holds, and the timer that holds a request to its deadline."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse

from ..errors import EndpointUnreachable
from ..names import escaped
from ..pace import Deadline, SocketWatchdog

#: Media types (OCI image-spec v1.1 ``media-types.md``, Docker's image manifest v2, modelpack/model-spec ``spec.md``).
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
MODEL_MANIFEST = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
#: The largest size a descriptor may declare (OCI image-spec ``descriptor.md``: an int64).
MAX_DECLARED = 2**63 - 1
SLOW_HINT = ("the registry answers too slowly; HFCACHE_METADATA_DEADLINE (seconds for a whole metadata answer) and "
             "HFCACHE_MIN_RATE / HFCACHE_RATE_WINDOW (the body floor) change the bounds")
local = threading.local()  # .dog: the Watchdog of the request this thread is sending


def digest_of(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``: the OCI digest of a blob or a document."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def canonical(document: dict) -> bytes:
    """``document`` as canonical JSON (sorted keys, no spaces, UTF-8): the same document always has the same
    digest."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def registry_text(value: object, limit: int = 200) -> str:
    """``value`` (text from a registry: an error's code or message, a header, a host) as one inert line of at most
    ``limit`` characters (ending ``...`` when cut): every character ``str.isprintable`` refuses (controls, line
    and paragraph separators, bidi and other format characters) escaped as ``\\xNN``/``\\uNNNN``."""
    text = escaped(str(value)[:limit * 2])
    return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


def size_ok(size: object) -> bool:
    """Whether a descriptor's ``size`` is a JSON integer (not a boolean, float or text) from 0 to
    :data:`MAX_DECLARED`."""
    return type(size) is int and 0 <= size <= MAX_DECLARED


def json_kind(value: object) -> str:
    """What a value parsed from a registry's JSON is, in words (``a list``, ``null``...), for a message that must not
    show it."""
    names = {dict: "an object", list: "a list", str: "a text", bool: "a boolean", int: "a number", float: "a number",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


def origin(address: str) -> tuple[str, str, int]:
    """``(scheme, lowercase host, port)`` of a URL (port defaulted by scheme): what credentials are bound to."""
    parts = urllib.parse.urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme, 0)


def netloc(address: str) -> str:
    return registry_text(urllib.parse.urlsplit(address).netloc or address, 100)


class Watchdog(SocketWatchdog):
    """Enforces one request's :class:`Deadline` from outside (:class:`hfcache.pace.SocketWatchdog`: its sockets shut
    down when it passes). Sockets are registered by :func:`hfcache.oci.registry._timeout_adapter`'s connections: on
    connect, or for an upload when the response is awaited (its deadline starts then)."""

    def __init__(self, deadline: Deadline, uploading: bool) -> None:
        self.uploading = uploading
        super().__init__(deadline, armed=False)

    def watch(self, sock, awaiting: bool = True) -> None:  # type: ignore[override]
        """Register ``sock`` (``awaiting``: the request is sent, its answer awaited) and start the timer."""
        if sock is None or (self.uploading and not awaiting):
            return
        with self._lock:
            if self._stopped:
                return
            if self.uploading and self._timer is None:
                self.deadline.start = time.monotonic()
            self._register(sock)
            self._arm()

    def error(self) -> EndpointUnreachable:
        return EndpointUnreachable(f"{self.deadline.what}: no complete answer within {self.deadline.seconds:g} s",
                                   hint=SLOW_HINT)


def watch(sock, awaiting: bool) -> None:
    dog = getattr(local, "dog", None)
    if dog is not None:
        dog.watch(sock, awaiting)
