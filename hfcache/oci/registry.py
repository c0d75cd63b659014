"""Registry access for ``hfcache push``/``pull``: references, requests (on oras-py's session), uploads.

The distribution API (distribution-spec v1.1) goes through ``oras`` (oras-py, the ORAS project's Python SDK): its
reference parsing, its requests session, its challenge parsing. Library gaps worked around here (checked in oras
0.2.43, ``provider.py``, ``auth/base.py``, ``auth/utils.py``, ``auth/token.py``):

- ``do_request`` retries *every* exception five times with sleeps of 3 s to 83 s (a refused password or a closed
  port takes minutes) and sends no timeout; its token requests send none either (a silent token endpoint hangs
  forever). So requests go through :meth:`_RegistryMethods.do_request` and every request of the session has a
  timeout.
- its token backend mistakes a ``Basic`` challenge (the distribution registry with htpasswd) for a token realm, and
  reads a token answer whole into memory: :meth:`_RegistryMethods._token` does the token flow with a bounded read.
- ``load_configs`` reads the auth files unreliably: hfcache reads them itself
  (:mod:`hfcache.oci.credentials`), and only when the registry asks for credentials (a 401 challenge).
- ``Container`` accepts names the distribution spec does not (upper case: the registry answers 404) and takes
  ``localhost/NAME`` for a Docker Hub name: :func:`parse_reference` validates with the spec's grammar.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from ..errors import EndpointUnreachable, HubError, UsageError
from .credentials import Credentials, file_credentials

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
#: distribution-spec v1.1 "Pulling manifests": the repository name and tag grammars.
_NAME = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_EXAMPLE = "e.g. registry.example.com/hf/cache:v1 (lowercase name, tag after ':')"
_MAX_ANSWER = 1024 * 1024  # an error document, an upload's answer: never more
_CHUNK = 1024 * 1024


class TransferSink(Protocol):
    """Receives transfer progress (the CLI draws it; the core never prints)."""

    def begin(self, label: str, total: int) -> None:
        """A blob transfer of ``total`` bytes starts."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes of the current blob were transferred."""


class RegistryAuthError(HubError):
    """The registry refused the request for want of (valid) credentials."""


# --- references ----------------------------------------------------------------------------------------------------


def parse_reference(reference: str):
    """Parse ``[REGISTRY/]NAME[:TAG][@DIGEST]`` with oras (default registry docker.io, tag ``latest``), validated
    with the distribution spec's grammar: NAME lowercase components joined by ``.``, ``_``, ``__`` or ``-``,
    separated by ``/`` (at most 255 characters with the registry); TAG ``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``; DIGEST
    ``sha256:<64 hex>``. A first component ``localhost`` (or with a ``.`` or ``:``) is the registry, as for docker.

    Returns:
        ``oras.container.Container`` (``registry``, ``api_prefix``, ``tag``, ``digest``).

    Raises:
        UsageError: not a valid reference (the message says which part).
    """
    import oras.container

    if not reference or any(c.isspace() for c in reference) or "://" in reference:
        raise UsageError(f"{reference!r} is not an image reference", hint=_EXAMPLE)
    try:
        if reference.startswith("localhost/"):
            container = oras.container.Container(reference.split("/", 1)[1], registry="localhost")
        else:
            container = oras.container.Container(reference)
    except ValueError:
        raise UsageError(f"{reference!r} is not an image reference", hint=_EXAMPLE) from None
    rest = reference.split("@", 1)[0]
    path = rest.rsplit(":", 1)[0] if ":" in rest.rsplit("/", 1)[-1] else rest
    first, _, remainder = path.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        path = remainder
    if path != container.api_prefix:  # oras reads "reg/a//b" as docker.io/b: a name it did not parse as written
        raise UsageError(f"{reference!r}: repository name {path!r} is not valid (lowercase letters and digits, "
                         "separated by '.', '_', '__', '-' or '/')", hint=_EXAMPLE)
    port = re.search(r"(?<=[^:]):([0-9]+)$", container.registry or "")
    if not _HOST.fullmatch(container.registry or "") or (port and not 0 < int(port.group(1)) < 65536):
        raise UsageError(f"{reference!r}: {container.registry!r} is not a registry host[:port]", hint=_EXAMPLE)
    name = container.api_prefix
    if not _NAME.fullmatch(name) or len(container.registry) + 1 + len(name) > 255:
        raise UsageError(f"{reference!r}: repository name {name!r} is not valid (lowercase letters and digits, "
                         "separated by '.', '_', '__', '-' or '/'; at most 255 characters)", hint=_EXAMPLE)
    if container.tag is not None and not _TAG.fullmatch(container.tag):
        raise UsageError(f"{reference!r}: tag {container.tag[:40]!r} is not valid (letters, digits, '_', '.', '-'; "
                         "at most 128, not starting with '.' or '-')", hint=_EXAMPLE)
    if container.digest is not None and not DIGEST.fullmatch(container.digest):
        raise UsageError(f"{reference!r}: the digest must be sha256:<64 lowercase hex>",
                         hint="copy it from `hfcache push` output: REGISTRY/NAME@sha256:...")
    return container


# --- requests ------------------------------------------------------------------------------------------------------


def _timeout_adapter(timeout: float):
    """A requests adapter that gives every request without a timeout this one (oras's token requests send none)."""
    from requests.adapters import HTTPAdapter

    class _TimeoutAdapter(HTTPAdapter):
        def send(self, request, timeout=None, **kwargs):  # noqa: ANN001 - requests' signature
            return super().send(request, timeout=timeout if timeout is not None else _timeout, **kwargs)

    _timeout = timeout
    return _TimeoutAdapter()


class _RegistryMethods:
    """What hfcache's client adds to oras's Registry (mixed in by :func:`_registry_class`): a request method that
    fails fast, answers Basic and Bearer challenges, times out, and reads the auth files only when the registry asks
    for credentials."""

    def __init__(self, container, plain_http: bool, credentials: Credentials | None, timeout: float) -> None:
        super().__init__(hostname=container.registry, insecure=plain_http, auth_backend="token")
        self._timeout = timeout
        self._authorization: str | None = None
        self._explicit = credentials is not None
        self._note = ""
        self.registry_name = container.registry
        for scheme in ("http://", "https://"):
            self.session.mount(scheme, _timeout_adapter(timeout))
        if credentials is not None:
            self.auth.set_basic_auth(credentials.username, credentials.password)

    def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):
        headers = dict(headers or {})
        response = self._send(method, url, data, headers, json, stream)
        if response.status_code != 401:
            return response
        response.close()
        self._authorization = self._answer(response.headers.get("Www-Authenticate", ""))
        if hasattr(data, "seek"):
            data.seek(0)
        response = self._send(method, url, data, headers, json, stream)
        if response.status_code == 401:
            response.close()
            raise self._auth_error()
        return response

    def _send(self, method, url, data, headers, json, stream):
        if self._authorization:
            headers["Authorization"] = self._authorization
        response = self.session.request(method, url, data=data, json=json, headers=headers, stream=True,
                                        verify=self._tls_verify, timeout=self._timeout, allow_redirects=True)
        if not stream:  # library gap: requests reads a whole body into memory; an answer here is small
            body = read_body(response, _MAX_ANSWER + 1, self.registry_name)
            if len(body) > _MAX_ANSWER:
                raise HubError(f"registry {self.registry_name}: an answer larger than {_MAX_ANSWER} bytes",
                               hint="check the registry address; this is not a distribution registry")
            response._content, response._content_consumed = body, True
        return response

    def _basic(self) -> str | None:
        if not self._explicit and getattr(self.auth, "_basic_auth", None) is None:
            self.auth._basic_auth, self._note = file_credentials(self.registry_name)
        return getattr(self.auth, "_basic_auth", None)

    def _answer(self, challenge: str) -> str:
        import oras.auth.utils

        scheme = challenge.split(" ", 1)[0].lower()
        basic = self._basic()
        if scheme == "basic" and basic:
            return f"Basic {basic}"
        if scheme == "bearer":
            token = self._token(oras.auth.utils.parse_auth_header(challenge), basic)
            if token:
                return f"Bearer {token}"
        raise self._auth_error()

    def _token(self, challenge, basic: str | None) -> str | None:
        """The distribution token flow (oras's ``request_token`` reads an unbounded answer): GET the realm with
        the challenge's service and scope, with the Basic credentials when there are some."""
        realm = str(challenge.realm or "")
        if not realm.startswith(("https://", "http://")):
            return None
        params = {key: value for key, value in (("service", challenge.service), ("scope", challenge.scope))
                  if value}
        headers = {"Authorization": f"Basic {basic}"} if basic else {}
        response = self.session.get(realm, params=params, headers=headers, stream=True, verify=self._tls_verify,
                                    timeout=self._timeout)
        if response.status_code != 200:
            response.close()
            return None
        try:
            answer = json.loads(read_body(response, _MAX_ANSWER, self.registry_name))
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError, RecursionError):
            raise HubError(f"registry {self.registry_name}: its token endpoint gave no token",
                           hint="check the registry address; its auth service may be down") from None
        return str(token) if token else None

    def _auth_error(self) -> RegistryAuthError:
        basic = getattr(self.auth, "_basic_auth", None)
        if basic:
            return RegistryAuthError(f"registry {self.registry_name} refused the credentials",
                                     hint="check --username/--password-stdin or the login in the auth file "
                                          "(`podman login` / `docker login`)")
        return RegistryAuthError(f"registry {self.registry_name} requires authentication",
                                 hint=(f"{self._note}; " if self._note else "") + "give --username and "
                                      "--password-stdin, or log in with `podman login` / `docker login` "
                                      "(REGISTRY_AUTH_FILE, ~/.docker/config.json)")


def _registry_class():
    """oras imported on first use: it pulls in requests and jsonschema, which no other command needs."""
    import oras.provider

    class _Registry(_RegistryMethods, oras.provider.Registry):
        """oras's Registry with a request method that fails fast, answers Basic and Bearer challenges, times out,
        and reads the auth files only when the registry asks for credentials."""

    return _Registry


def connect(container, plain_http: bool, credentials: Credentials | None, timeout: float):
    """A client for ``container``'s registry (nothing is sent yet)."""
    return _registry_class()(container, plain_http, credentials, timeout)


def url(client, container, kind: str, ref: str) -> str:
    """``<scheme>://<registry>/v2/<name>/<kind>/<ref>``."""
    return f"{client.prefix}://{container.registry}/v2/{container.api_prefix}/{kind}/{ref}"


@contextlib.contextmanager
def network_errors(registry: str, plain_http: bool) -> Iterator[None]:
    """Turn requests' connection, TLS and timeout errors into one-line hfcache errors (exit 3)."""
    import requests

    try:
        yield
    except requests.exceptions.SSLError as exc:
        raise EndpointUnreachable(f"registry {registry}: TLS failed ({type(exc).__name__})",
                                  hint="for a registry without TLS on a trusted network, pass --plain-http") from None
    except requests.exceptions.Timeout:
        raise EndpointUnreachable(f"registry {registry}: no answer within the timeout",
                                  hint="check the registry, or give it longer with --timeout SECONDS") from None
    except requests.exceptions.ConnectionError as exc:
        hint = "check the registry address" + ("" if plain_http else "; a registry without TLS needs --plain-http")
        raise EndpointUnreachable(f"registry {registry} unreachable ({_reason(exc)})", hint=hint) from None
    except requests.exceptions.RequestException as exc:
        raise HubError(f"registry {registry}: {type(exc).__name__}: {exc}",
                       hint="check the registry address and try again") from None


def stream_errors() -> tuple[type[BaseException], ...]:
    """The exceptions reading a streamed body raises (urllib3's, not requests', and socket errors)."""
    import requests
    import urllib3.exceptions

    return (urllib3.exceptions.HTTPError, requests.exceptions.RequestException, ConnectionError, TimeoutError)


def read_body(response, limit: int, registry: str) -> bytes:
    """At most ``limit`` bytes of a streamed answer (decoded), then the answer is closed.

    Raises:
        EndpointUnreachable: the connection broke while reading.
    """
    try:
        return response.raw.read(limit, decode_content=True)
    except stream_errors() as exc:
        raise EndpointUnreachable(f"registry {registry}: the answer broke off ({type(exc).__name__})",
                                  hint="check the registry and try again") from None
    finally:
        response.close()


def _reason(exc: Exception) -> str:
    text = str(exc)
    for needle in ("Connection refused", "Name or service not known", "Connection reset", "Remote end closed"):
        if needle in text:
            return needle.lower()
    return type(exc).__name__


def check(response, what: str, *expected: int) -> None:
    """Raise a one-line error unless ``response`` has one of the ``expected`` statuses.

    Raises:
        RegistryAuthError: 401/403; HubError: any other status (the registry's error codes in the message).
    """
    if response.status_code in expected:
        return
    detail = ""
    with contextlib.suppress(ValueError, AttributeError, TypeError, RecursionError, *stream_errors()):
        body = response.content if response._content_consumed else response.raw.read(_MAX_ANSWER, decode_content=True)
        errors = json.loads(body).get("errors") or []
        detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))[:300]
    if response.status_code in (401, 403):
        raise RegistryAuthError(f"{what}: access denied (HTTP {response.status_code}) {detail}".rstrip(),
                                hint="give --username and --password-stdin, or log in with podman/docker")
    raise HubError(f"{what}: HTTP {response.status_code} {detail}".rstrip(),
                   hint="check the reference and the registry; try again if it is a server error")


class _ProgressFile(io.RawIOBase):
    """A file read for an upload body, reporting progress (requests streams a file object with Content-Length)."""

    def __init__(self, path: Path, sink: TransferSink | None) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._sink = sink
        self.sent = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(_CHUNK if size is None or size < 0 else size)
        self.sent += len(data)
        if self._sink is not None and data:
            self._sink.advance(len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.sent = 0
        return self._f.seek(offset, whence)

    def close(self) -> None:
        self._f.close()
        super().close()


def upload(client, container, digest: str, path: Path, size: int, sink: TransferSink | None, label: str) -> int:
    """Upload one blob unless the registry has it (HEAD); return the bytes sent.

    The monolithic upload of distribution-spec ("POST then PUT"): the body is streamed from the file.

    Raises:
        RegistryAuthError, HubError: the registry refused.
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
