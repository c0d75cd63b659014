"""Registry access for ``hfcache push``/``pull``: references, and requests on oras-py's session (uploads:
:mod:`.upload`; origins, inert text, the deadline timer: :mod:`.peer`). The oras-py gaps this closes (no timeout,
retries of every error, blind redirects, lax names and token flow): docs/oci.md "Why oras-py".
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import urllib.parse
from collections.abc import Iterator
from typing import Protocol

from ..bounds import loads_json
from ..errors import EndpointUnreachable, HubError, UsageError
from ..names import is_oci_digest
from ..pace import Deadline, Throughput, TooSlow, metadata_deadline, min_rate
from .credentials import Credentials, file_credentials
from .peer import SLOW_HINT, Watchdog, local, netloc, origin, registry_text, watch

#: distribution-spec v1.1 "Pulling manifests": the repository name and tag grammars.
_NAME = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_EXAMPLE = "e.g. registry.example.com/hf/cache:v1 (lowercase name, tag after ':')"
_MAX_ANSWER = 1024 * 1024  # an error document, an upload's answer: never more
_CHUNK = 1024 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_HOPS = 10
_BODY_HEADERS = ("content-length", "content-type", "content-encoding")  # dropped when a redirect drops the body


class TransferSink(Protocol):
    """Receives transfer progress (the CLI draws it; the core never prints)."""

    def begin(self, label: str, total: int) -> None:
        """A blob transfer of ``total`` bytes starts."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes of the current blob were transferred."""


class RegistryAuthError(HubError):
    """The registry refused the request for want of (valid) credentials."""


def parse_reference(reference: str):
    """``[REGISTRY/]NAME[:TAG][@DIGEST]`` parsed by oras (default registry docker.io, tag ``latest``) as an
    ``oras.container.Container`` (``registry``, ``api_prefix``, ``tag``, ``digest``), validated with the
    distribution spec's grammars. A first component ``localhost``, or with a ``.`` or ``:``, is the registry, as for
    docker. Raises UsageError: not a valid reference (the message says which part)."""
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
    if container.digest is not None and not is_oci_digest(container.digest):
        raise UsageError(f"{reference!r}: the digest must be sha256:<64 lowercase hex>",
                         hint="copy it from `hfcache push` output: REGISTRY/NAME@sha256:...")
    return container


def _watched_pools() -> dict:
    """urllib3 connection pools whose connections register their socket with this thread's :class:`.peer.Watchdog`."""
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def watched(base):
        class _Watched(base):
            def _new_conn(self):  # urllib3's signature
                sock = super()._new_conn()
                watch(sock, awaiting=False)
                return sock

            def getresponse(self):  # urllib3's signature
                watch(self.sock, awaiting=True)
                return super().getresponse()
        return _Watched

    class _Pool(HTTPConnectionPool):
        ConnectionCls = watched(HTTPConnection)

    class _TLSPool(HTTPSConnectionPool):
        ConnectionCls = watched(HTTPSConnection)

    return {"http": _Pool, "https": _TLSPool}


def _timeout_adapter(timeout: float):
    """A requests adapter that gives every request without a timeout this one (oras's token requests send none)
    and whose connections a request's :class:`.peer.Watchdog` can shut down (not through a SOCKS proxy)."""
    from requests.adapters import HTTPAdapter

    pools = _watched_pools()

    class _TimeoutAdapter(HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs) -> None:  # requests' signature
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy, **kwargs):  # requests' signature
            manager = super().proxy_manager_for(proxy, **kwargs)
            if type(manager).__name__ == "ProxyManager":
                manager.pool_classes_by_scheme = pools
            return manager

        def send(self, request, timeout=None, **kwargs):  # requests' signature
            return super().send(request, timeout=timeout if timeout is not None else default, **kwargs)

    default = timeout
    return _TimeoutAdapter()


class _RegistryMethods:
    """What hfcache's client adds to oras's Registry (mixed in by :func:`connect`): a request method that fails
    fast, answers Basic and Bearer challenges, times out, and reads the auth files only when asked for credentials."""

    def __init__(self, container, plain_http: bool, credentials: Credentials | None, timeout: float) -> None:
        super().__init__(hostname=container.registry, insecure=plain_http, auth_backend="token")
        self._timeout = timeout
        self._authorization: str | None = None
        self._explicit = credentials is not None
        self._note = ""
        self.registry_name = container.registry
        self.overall: Deadline | None = None  # the phase's deadline inside :meth:`within`
        for scheme in ("http://", "https://"):
            self.session.mount(scheme, _timeout_adapter(timeout))
        if credentials is not None:
            self.auth.set_basic_auth(credentials.username, credentials.password)

    @contextlib.contextmanager
    def within(self, deadlines: int, what: str) -> Iterator[None]:
        """Every request made inside ends, all together, within ``deadlines`` metadata deadlines (each one also
        within its own); ``what`` names the phase in the error."""
        self.overall = Deadline(deadlines * metadata_deadline(self._timeout), what)
        try:
            yield
        finally:
            self.overall = None

    def _deadline(self, what: str) -> Deadline:
        """A request's deadline: the metadata deadline, or the rest of :meth:`within`'s when that ends first."""
        own, overall = Deadline(metadata_deadline(self._timeout), what), self.overall
        return own if overall is None or overall.remaining() >= own.seconds else dataclasses.replace(overall)

    def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):
        """One request to the registry, redirects followed (at most 10), a 401 from the registry answered once.

        Credentials and tokens go only to the registry's origin; a 401 from another origin (a redirect target) is
        refused. Every hop's headers, and the body unless ``stream``, are read under the metadata deadline; with
        ``stream`` the caller reads the body (:func:`read_body`, or :class:`BlobBody` under the throughput floor).

        Raises:
            RegistryAuthError: refused credentials, none to give, or a 401 from another origin (naming both).
            EndpointUnreachable: the deadline passed; HubError: more than 10 redirects, a non-HTTP redirect.
        """
        response = self._follow(method, url, data, headers, json)
        if response.status_code == 401 and self._own(response.url):
            response.close()
            self._authorization = self._answer(response.headers.get("Www-Authenticate", ""))
            response = self._follow(method, url, data, headers, json)
            if response.status_code == 401 and self._own(response.url):
                response.close()
                raise self._auth_error()
        if response.status_code == 401:
            response.close()
            raise RegistryAuthError(
                f"registry {self.registry_name}: {method} {registry_text(urllib.parse.urlsplit(url).path, 120)} was "
                f"redirected to {netloc(response.url)}, which asks for credentials (HTTP 401); not answered",
                hint=f"hfcache sends the credentials and tokens for {self.registry_name} to {self.registry_name} "
                     "only; the registry must redirect to a location that needs none")
        if not stream:  # library gap: requests reads a whole body into memory; an answer here is small
            body = read_body(response, _MAX_ANSWER + 1, self.registry_name)
            if len(body) > _MAX_ANSWER:
                raise HubError(f"registry {self.registry_name}: an answer larger than {_MAX_ANSWER} bytes",
                               hint="check the registry address; this is not a distribution registry")
            response._content, response._content_consumed = body, True
        return response

    def _own(self, address: str) -> bool:
        """Whether ``address`` is on the registry's origin (``docker.io``'s API host is registry-1.docker.io, as for
        docker)."""
        own = origin(f"{self.prefix}://{self.registry_name}/")
        aliases = {own, ("https", "registry-1.docker.io", 443)} if own == ("https", "docker.io", 443) else {own}
        return origin(address) in aliases

    def _follow(self, method, address, data, headers, json_body, params=None, authorization=None, bound=None):
        """Send, following redirects here: ``authorization`` (default: the registry's) is set on hops to origin
        ``bound`` (default: the registry's) only. The response carries the request's :class:`.peer.Watchdog`."""
        own = origin(f"{self.prefix}://{self.registry_name}/")
        authorization, bound = (authorization, bound) if bound else (self._authorization, own)
        path = registry_text(urllib.parse.urlsplit(address).path, 120)
        dog = Watchdog(self._deadline(f"registry {self.registry_name}: {method} {path}"),
                       uploading=hasattr(data, "read"))
        try:
            for _ in range(_MAX_HOPS + 1):
                hop = dict(headers or {})
                if authorization and (origin(address) == bound if bound != own else self._own(address)):
                    hop["Authorization"] = authorization
                if hasattr(data, "seek"):
                    data.seek(0)
                if dog.fired or (not dog.uploading and dog.deadline.remaining() <= 0):
                    raise dog.error()
                response = self._hop(method, address, data, hop, json_body, params, dog)
                location = response.headers.get("Location")
                if response.status_code not in _REDIRECTS or not location:
                    break
                response.close()
                address, params = urllib.parse.urljoin(address, location), None
                if not address.lower().startswith(("http://", "https://")):
                    raise HubError(f"registry {self.registry_name}: a redirect to a non-HTTP address "
                                   f"{registry_text(address, 100)}", hint="this is not a distribution registry")
                if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
                    method, data, json_body = ("HEAD" if method == "HEAD" else "GET"), None, None
                    headers = {k: v for k, v in (headers or {}).items() if k.lower() not in _BODY_HEADERS}
            else:
                raise HubError(f"registry {self.registry_name}: more than {_MAX_HOPS} redirects for {path}",
                               hint="check the registry address; it redirects in a loop")
        except BaseException:
            dog.stop()
            raise
        close = response.close

        def closing() -> None:
            dog.stop()
            close()

        response.close, response.hfcache_watchdog = closing, dog
        return response

    def _hop(self, method, address, data, headers, json_body, params, dog):
        import requests

        local.dog = dog
        try:
            return self.session.request(method, address, data=data, json=json_body, headers=headers, params=params,
                                        stream=True, verify=self._tls_verify, timeout=self._timeout,
                                        allow_redirects=False)
        except requests.exceptions.RequestException:
            if dog.fired:
                raise dog.error() from None
            raise
        finally:
            local.dog = None

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
        """The distribution token flow: GET the realm with the challenge's service and scope, with the Basic
        credentials when there are some. The challenge is the registry's own, so its realm may be on another host
        (``auth.docker.io``): the credentials go to that realm's origin only, never over plain HTTP from an HTTPS
        registry, and the token only to the registry."""
        realm = str(challenge.realm or "")
        if not realm.startswith(("https://", "http://")):
            return None
        if realm.startswith("http://") and self.prefix == "https" and basic:
            raise RegistryAuthError(f"registry {self.registry_name}: its token realm {netloc(realm)} is plain "
                                    "HTTP; the credentials were not sent",
                                    hint="an HTTPS registry's token service must be HTTPS too")
        params = {key: value for key, value in (("service", challenge.service), ("scope", challenge.scope))
                  if value}
        response = self._follow("GET", realm, None, {}, None, params=params,
                                authorization=f"Basic {basic}" if basic else None, bound=origin(realm))
        if response.status_code != 200:
            response.close()
            return None
        try:
            answer = loads_json(read_body(response, _MAX_ANSWER, self.registry_name), "token answer")
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            raise HubError(f"registry {self.registry_name}: its token endpoint gave no token",
                           hint="check the registry address; its auth service may be down") from None
        return token if isinstance(token, str) and token else None  # a list or object is no token: never sent

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


def connect(container, plain_http: bool, credentials: Credentials | None, timeout: float):
    """A client for ``container``'s registry (nothing is sent yet): oras's ``Registry`` with
    :class:`_RegistryMethods` (oras imported on first use: it pulls in requests and jsonschema)."""
    import oras.provider

    class _Registry(_RegistryMethods, oras.provider.Registry):
        pass

    return _Registry(container, plain_http, credentials, timeout)


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
    except requests.exceptions.RequestException as exc:  # its text may hold a redirect's Location
        raise HubError(f"registry {registry}: {type(exc).__name__}: {registry_text(exc)}",
                       hint="check the registry address and try again") from None
    except TooSlow as exc:  # an upload below the floor (raised inside requests' send loop)
        raise EndpointUnreachable(f"registry {registry}: {exc}", hint=SLOW_HINT) from None


def stream_errors() -> tuple[type[BaseException], ...]:
    """The exceptions reading a streamed body raises (urllib3's, not requests', and socket errors)."""
    import requests
    import urllib3.exceptions

    return (urllib3.exceptions.HTTPError, requests.exceptions.RequestException, ConnectionError, TimeoutError)


def read_body(response, limit: int, registry: str) -> bytes:
    """At most ``limit`` decoded bytes of the unread body of the streamed ``response``, read under the request's
    deadline (its :class:`.peer.Watchdog`); the answer is closed then. Raises EndpointUnreachable: the connection
    broke while reading, or the deadline passed (exit 3; naming ``registry``)."""
    dog = getattr(response, "hfcache_watchdog", None)
    chunks, got = [], 0
    try:
        while got < limit:
            data = response.raw.read1(min(_CHUNK, limit - got), decode_content=True)
            if dog is not None:
                dog.deadline.check()
            if not data:
                break
            chunks.append(data[:limit - got])
            got += len(chunks[-1])
    except TooSlow:
        raise dog.error() from None
    except stream_errors() as exc:
        if dog is not None and dog.fired:
            raise dog.error() from None
        raise EndpointUnreachable(f"registry {registry}: the answer broke off ({type(exc).__name__})",
                                  hint="check the registry and try again") from None
    finally:
        response.close()
    if dog is not None and dog.fired:  # a socket shut down by the deadline can look like a clean end
        raise dog.error()
    return b"".join(chunks)


class BlobBody:
    """The body of the streamed ``response`` as it arrives (urllib3 ``read1``), under the throughput floor
    (:func:`hfcache.pace.min_rate`) instead of the metadata deadline; ``registry`` and ``what`` name it."""

    def __init__(self, response, registry: str, what: str) -> None:
        dog = getattr(response, "hfcache_watchdog", None)
        if dog is not None:
            dog.stop()
        rate, window = min_rate()
        self._raw, self._floor = response.raw, Throughput(rate, window, f"registry {registry}: {what}")

    def read(self, size: int) -> bytes:
        """Up to ``size`` raw (undecoded) bytes; b"" at the end. Raises EndpointUnreachable below the floor
        (exit 3), or the urllib3 errors of :func:`stream_errors`."""
        data = self._raw.read1(size, decode_content=False)
        try:
            self._floor.feed(len(data))
        except TooSlow as exc:
            raise EndpointUnreachable(str(exc), hint=SLOW_HINT) from None
        return data


def _reason(exc: Exception) -> str:
    text = str(exc)
    for needle in ("Connection refused", "Name or service not known", "Connection reset", "Remote end closed"):
        if needle in text:
            return needle.lower()
    return type(exc).__name__


def request(client, address: str, method: str, tries: int = 1, **kwargs):
    """``client.do_request``, repeated (at most ``tries`` times, 0.2 s, 0.4 s apart) while the registry answers
    500-504: distribution 2.8 answers 500 to a read of a tag another client is writing."""
    for attempt in range(tries):
        response = client.do_request(address, method, **kwargs)
        if response.status_code not in (500, 502, 503, 504) or attempt == tries - 1:
            return response
        response.close()
        time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def get_bounded(client, address: str, accept: str, limit: int, what: str, tries: int = 1):
    """``GET address`` (:func:`request`): (at most ``limit + 1`` body bytes, or None on a 404; the media type of
    ``Content-Type``; the response headers). Raises what :func:`check` (another status than 200) and
    :func:`read_body` raise."""
    response = request(client, address, "GET", tries, headers={"Accept": accept}, stream=True)
    with response:
        if response.status_code == 404:
            return None, "", response.headers
        check(response, what, 200)
        body = read_body(response, limit + 1, client.registry_name)
    return body, response.headers.get("Content-Type", "").split(";")[0].strip(), response.headers


def check(response, what: str, *expected: int) -> None:
    """Raise a one-line error unless ``response`` has one of the ``expected`` statuses: RegistryAuthError for
    401/403, else HubError (the registry's error codes in the message)."""
    if response.status_code in expected:
        return
    detail = ""
    with contextlib.suppress(ValueError, AttributeError, TypeError, HubError):
        body = response.content if response._content_consumed else read_body(response, _MAX_ANSWER, what)
        errors = loads_json(body, f"{what}: error document").get("errors") or []
        detail = registry_text("; ".join(f"{registry_text(e.get('code'), 60)}: {registry_text(e.get('message'))}"
                                         for e in errors[:10] if isinstance(e, dict)), 300)
    if response.status_code in (401, 403):
        raise RegistryAuthError(f"{what}: access denied (HTTP {response.status_code}) {detail}".rstrip(),
                                hint="give --username and --password-stdin, or log in with podman/docker")
    raise HubError(f"{what}: HTTP {response.status_code} {detail}".rstrip(),
                   hint="check the reference and the registry; try again if it is a server error")
