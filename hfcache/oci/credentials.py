"""Registry credentials for ``hfcache push``/``pull``: ``--username``/``--password-stdin``, or the auth files, read
in containers-auth.json(5)'s order, bounded, when the registry answers 401 (oras's ``load_configs``: docs/oci.md).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
from dataclasses import dataclass

from ..errors import UsageError

_MAX_AUTH_FILE = 1024 * 1024
_HELPER_TIMEOUT = 30.0


@dataclass(frozen=True)
class Credentials:
    """A registry username and password (``--username`` / ``--password-stdin``); never printed or stored."""

    username: str
    password: str = ""

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***)"


def auth_files() -> list[str]:
    """The existing credential files, in the order podman/skopeo and docker look: ``REGISTRY_AUTH_FILE``,
    ``$XDG_RUNTIME_DIR/containers/auth.json``, ``~/.config/containers/auth.json``, ``$DOCKER_CONFIG/config.json``
    else ``~/.docker/config.json``."""
    candidates = [os.environ.get("REGISTRY_AUTH_FILE", "")]
    if os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    candidates.append(os.path.expanduser("~/.config/containers/auth.json"))
    docker = os.environ.get("DOCKER_CONFIG")
    candidates.append(os.path.join(docker, "config.json") if docker else os.path.expanduser("~/.docker/config.json"))
    return [c for c in candidates if c and os.path.isfile(c)]


def _read_auth_file(path: str) -> dict:
    """One auth file as a dict. Raises UsageError naming it: unreadable, too large, not a JSON object."""
    hint = "fix or remove it (hfcache reads the auth files only when a registry asks for credentials)"
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_AUTH_FILE + 1)
    except OSError as exc:
        raise UsageError(f"registry auth file {path}: cannot read it ({exc.strerror})", hint=hint) from None
    if len(data) > _MAX_AUTH_FILE:
        raise UsageError(f"registry auth file {path}: larger than {_MAX_AUTH_FILE} bytes", hint=hint)
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"registry auth file {path}: not valid JSON ({getattr(exc, 'msg', 'nested too deep')})",
                         hint=hint) from None
    if not isinstance(document, dict):
        raise UsageError(f"registry auth file {path}: not a JSON object", hint=hint)
    return document


def _hosts(registry: str) -> list[str]:
    """The registry and its ``localhost``/``127.0.0.1`` alias (as oras and docker match them)."""
    for name, alias in (("localhost", "127.0.0.1"), ("127.0.0.1", "localhost")):
        if registry.startswith(name):
            return [registry, registry.replace(name, alias, 1)]
    return [registry]


def _auths_entry(auths: object, host: str) -> object:
    """The ``auths`` entry for ``host``: keyed ``host`` or with a scheme and path (``https://host/v1/``)."""
    if not isinstance(auths, dict):
        return None
    for key, entry in auths.items():
        if str(key).split("://", 1)[-1].split("/", 1)[0] == host:
            return entry
    return None


def _basic_from_entry(entry: object, path: str) -> str | None:
    auth = entry.get("auth") if isinstance(entry, dict) else None
    if not auth:
        return None
    try:
        if ":" not in base64.b64decode(str(auth), validate=True).decode("utf-8"):
            raise ValueError
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise UsageError(f"registry auth file {path}: an \"auth\" value is not base64 of user:password",
                         hint="log in again (`podman login` / `docker login`)") from None
    return str(auth)


def _from_helper(helper: str, host: str) -> tuple[str | None, str]:
    """Ask ``docker-credential-<helper> get`` for ``host``: (base64 user:password or None, why not)."""
    binary = f"docker-credential-{helper}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", helper):
        return None, f"credential helper name {helper[:40]!r} is not valid"
    try:
        proc = subprocess.run([binary, "get"], input=host.encode(), capture_output=True, timeout=_HELPER_TIMEOUT,
                              check=False)
    except FileNotFoundError:
        return None, f"credential helper {binary} is not installed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"credential helper {binary} failed ({type(exc).__name__})"
    try:
        payload = json.loads(proc.stdout) if proc.returncode == 0 else None
        username, secret = str(payload["Username"]), str(payload["Secret"])
    except (ValueError, TypeError, KeyError):
        return None, f"credential helper {binary} gave no credentials for {host}"
    return base64.b64encode(f"{username}:{secret}".encode()).decode(), ""


def file_credentials(registry: str) -> tuple[str | None, str]:
    """(base64 ``user:password`` or None, why none was found for the error's hint) for ``registry`` from the first
    auth file (:func:`auth_files`) with an entry for it: ``auths``, else ``credHelpers``, else ``credsStore``.
    Raises UsageError: a file that has to be read is broken (names the file)."""
    note = ""
    for path in auth_files():
        config = _read_auth_file(path)
        for host in _hosts(registry):
            basic = _basic_from_entry(_auths_entry(config.get("auths"), host), path)
            if basic:
                return basic, ""
            helpers = config.get("credHelpers") if isinstance(config.get("credHelpers"), dict) else {}
            helper = helpers.get(host) or (config.get("credsStore") if isinstance(config.get("credsStore"), str)
                                           else None)
            if helper:
                basic, note = _from_helper(str(helper), host)
                if basic:
                    return basic, ""
    return None, note
