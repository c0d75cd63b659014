"""Names in the Hub's and the cache's vocabulary, each defined once: repo types (folder and URL prefixes), repo folder
names both ways, and the validators of etags, commits, refs and algorithm-prefixed hashes.

A leaf (imports only :mod:`hfcache.errors`). Sources: huggingface_hub ``constants.py`` (``REPO_TYPES_WITH_KERNEL``,
``REPO_TYPES_URL_PREFIXES``) and ``file_download.py`` (``repo_folder_name``); the cache layout in docs/cache-layout.md.
"""

from __future__ import annotations

import re
import unicodedata

from .errors import CacheError

#: Every repo type a cache folder can hold, with its plural: the folder prefix ``{plural}--`` and the URL prefix
#: ``{plural}/`` (none for models). huggingface_hub constants.py ``REPO_TYPES_WITH_KERNEL``.
PLURALS = {"model": "models", "dataset": "datasets", "space": "spaces", "kernel": "kernels"}
TYPE_OF_PLURAL = {plural: repo_type for repo_type, plural in PLURALS.items()}
#: The folder prefixes of repo folders (``models--`` ...).
FOLDER_PREFIXES = tuple(f"{p}--" for p in PLURALS.values())

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BAD_REF = re.compile(r"(^|/)\.\.?(/|$)|^/|\\|\x00|//|/$")
#: The algorithm-prefixed hash a lock or record writes: ``sha256:<64 hex>`` or ``git-sha1:<40 hex>``.
_PREFIXED = {"sha256": _HEX64, "git-sha1": _HEX40}
_BROKEN = "the endpoint, lock or archive that named it is broken or hostile"
#: Unicode categories that are no inert text in generated output: controls (C0, DEL, C1 with U+0085), format
#: characters (bidi overrides, zero-width), lone surrogates (``surrogateescape`` of a non-UTF-8 path), and the line
#: and paragraph separators U+2028/U+2029 (YAML, JavaScript and ``str.splitlines`` break lines there).
NOT_INERT = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class UnsafeName(CacheError):
    """A blob, commit or ref name that would build a path outside its folder (refused before any filesystem call)."""


def not_inert(value: str) -> str | None:
    """The first character of ``value`` that is not inert text (:data:`NOT_INERT`), else None."""
    return next((c for c in value if unicodedata.category(c) in NOT_INERT), None)


def escaped(text: str) -> str:
    """``text`` with every character ``str.isprintable`` refuses written as ``\\xNN`` or ``\\uNNNN``."""
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def url_prefix(repo_type: str) -> str:
    """``datasets/``, ``spaces/``, ``kernels/`` or ``""`` (models): the prefix of a repo's ``resolve`` URLs."""
    return f"{PLURALS[repo_type]}/" if repo_type in PLURALS and repo_type != "model" else ""


def repo_folder_name(repo_id: str, repo_type: str = "model") -> str:
    """``models--ORG--NAME`` (``datasets--``, ``spaces--``, ``kernels--``): huggingface_hub
    ``file_download.repo_folder_name``, restated because importing that module loads the HTTP stack."""
    return "--".join([PLURALS.get(repo_type, f"{repo_type}s"), *repo_id.split("/")])


def parse_folder_name(name: str) -> tuple[str, str] | None:
    """``models--ORG--NAME`` -> (``ORG/NAME``, ``model``); None for names that are not repo folders."""
    prefix, sep, rest = name.partition("--")
    if not sep or prefix not in TYPE_OF_PLURAL or not rest:
        return None
    parts = rest.split("--")
    if len(parts) > 2 or any(p in ("", ".", "..") for p in parts):
        return None
    return "/".join(parts), TYPE_OF_PLURAL[prefix]


def is_commit(value: object) -> bool:
    """Whether ``value`` is a 40-hex lowercase commit hash."""
    return isinstance(value, str) and _HEX40.fullmatch(value) is not None


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a 64-hex lowercase sha256 (an LFS file's etag, an OCI digest's hex, a Xet hash)."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def is_etag(value: object) -> bool:
    """Whether ``value`` names a blob: 40 hex (git blob sha1) or 64 hex (sha256)."""
    return is_commit(value) or is_sha256(value)


def is_prefixed_hash(value: object) -> bool:
    """Whether ``value`` is ``sha256:<64 hex>`` or ``git-sha1:<40 hex>`` (the form locks and records write)."""
    if not isinstance(value, str):
        return False
    algorithm, _, hexdigest = value.partition(":")
    pattern = _PREFIXED.get(algorithm)
    return pattern is not None and pattern.fullmatch(hexdigest) is not None


def is_oci_digest(value: object) -> bool:
    """Whether ``value`` is an OCI ``sha256:<64 hex>`` digest (the only algorithm hfcache writes or accepts)."""
    return isinstance(value, str) and value.startswith("sha256:") and is_sha256(value[7:])


def check_etag(etag: object) -> str:
    """Return ``etag`` when it is a blob name (40 or 64 lowercase hex), else raise UnsafeName."""
    if not is_etag(etag):
        raise UnsafeName(f"refusing blob name {etag!r}: not 40 or 64 lowercase hex characters", hint=_BROKEN)
    return etag  # type: ignore[return-value]


def check_commit(commit: object) -> str:
    """Return ``commit`` when it is 40 lowercase hex characters, else raise UnsafeName."""
    if not is_commit(commit):
        raise UnsafeName(f"refusing commit {commit!r}: not 40 lowercase hex characters", hint=_BROKEN)
    return commit  # type: ignore[return-value]


def check_ref_name(revision: object) -> str:
    """Return ``revision`` when it can name a file under ``refs/`` (relative, no ``.``/``..``), else UnsafeName."""
    if not isinstance(revision, str) or not revision or _BAD_REF.search(revision):
        raise UnsafeName(f"refusing ref name {revision!r}: not a relative path inside refs/",
                         hint="use a branch, tag or 40-hex commit")
    return revision


def check_folder_name(name: object) -> str:
    """Return ``name`` when it can be one component below the cache root (a repo folder name), else UnsafeName."""
    if not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\x00" in name:
        raise UnsafeName(f"refusing repo folder name {name!r}")
    return name
