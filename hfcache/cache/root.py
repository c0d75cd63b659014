"""The cache root: where it is (huggingface_hub ``constants.py``: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``), what a folder given as one is, making it (``CACHEDIR.TAG``), the errors that name
what blocks it, and questions about the whole cache (symlink support, a blob another repo folder holds).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError, UsageError
from ..names import FOLDER_PREFIXES, check_etag, repo_folder_name  # noqa: F401 - repo_folder_name re-exported
from ..records import MAX_NAME_BYTES as NAME_MAX  # Linux limits.h; PATH_MAX counts the terminating NUL
from ..records import MAX_PATH_BYTES as PATH_MAX
from . import safefs
from .access import blocking_dir, join_fix, reach_fix
from .atomic import atomic_write_at
from .shared_store import STORE_DIR, payload_stat
from .sharing import cache_policy, open_dirs

# Same text as huggingface_hub's _local_folder.CACHEDIR_TAG_CONTENT (the Cache Directory Tagging Standard).
CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by huggingface_hub.\n"
    "# For information about cache directory tags, see:\n"
    "#\thttps://bford.info/cachedir/\n"
)


def default_cache_dir(environ: dict[str, str] | None = None) -> tuple[Path, str]:
    """The cache directory huggingface_hub would use and the setting that chose it (``"HF_HUB_CACHE"``,
    ``"HF_HOME"``, ``"XDG_CACHE_HOME"`` or ``"default"``), with huggingface_hub's precedence, read at call time."""
    env = os.environ if environ is None else environ
    expand = lambda name: Path(os.path.expandvars(os.path.expanduser(env[name])))  # noqa: E731
    if env.get("HF_HUB_CACHE"):
        return expand("HF_HUB_CACHE"), "HF_HUB_CACHE"
    if env.get("HF_HOME"):
        return expand("HF_HOME") / "hub", "HF_HOME"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub", "XDG_CACHE_HOME"
    return Path.home() / ".cache" / "huggingface" / "hub", "default"


def check_path_text(path: str | os.PathLike[str], what: str) -> str:
    """``path`` (as given: a command line, a manifest, a lock or the environment) as text, refused before any call
    makes it an OSError, ValueError or RuntimeError (exit 70); ``what`` names it in the error (``"--cache-dir"``).
    Raises UsageError (exit 2): a NUL byte, a component longer than NAME_MAX bytes, or PATH_MAX bytes or more."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    if "\0" in text:
        raise UsageError(f"{what}: the path {text.replace(chr(0), '<NUL>')[:200]!r} holds a NUL byte",
                         hint="no file system can name it")
    encoded = os.fsencode(text)
    if len(encoded) >= PATH_MAX:
        raise UsageError(f"{what}: the path is {len(encoded)} bytes long (the limit is {PATH_MAX - 1})",
                         hint="choose a shorter path")
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise UsageError(f"{what}: a path component is {len(longest)} bytes long (the limit is {NAME_MAX}): "
                         f"{os.fsdecode(longest[:40])!r}...", hint="choose a shorter path")
    return text


def expand_user(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded (:meth:`pathlib.Path.expanduser`); UsageError (exit 2)
    when ``~user`` names no user or ``~`` has no home."""
    try:
        return Path(check_path_text(path, what)).expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        first = os.fspath(path).split("/", 1)[0]
        raise UsageError(f"{what}: {first[:100]!r} names no home directory (no such user)",
                         hint="write the path out in full") from None


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """``cache_dir`` (``~`` expanded) as an absolute Path, or the default (:func:`default_cache_dir`) when None.
    Raises UsageError (exit 2) for a path the OS cannot hold or a ``~user`` that does not exist, whoever gave it."""
    if cache_dir is None:
        try:
            root, source = default_cache_dir()
        except RuntimeError:  # Path.home() without HOME or a passwd entry
            raise UsageError("cannot find the default cache: no home directory",
                             hint="set HF_HUB_CACHE or HF_HOME, or pass --cache-dir") from None
        root = root.absolute()
        check_path_text(root, f"the cache (from {source})")
        return root
    if not os.fspath(cache_dir).strip():  # `--cache-dir "$CACHE"` with CACHE unset meant the working directory
        raise UsageError("the cache directory is empty", hint="pass a path, or leave --cache-dir out for the default")
    root = expand_user(cache_dir, "the cache directory").absolute()
    check_path_text(root, "the cache directory")
    return root


def existing_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """:func:`resolve_cache_dir` for commands that only read a cache. Raises CacheError: no directory there, or this
    user cannot reach or list it (never reported as "no cache": Python 3.11's ``Path.is_dir`` raises then)."""
    root = resolve_cache_dir(cache_dir)
    try:
        is_dir = root.is_dir()
    except PermissionError:
        raise access_error(root) from None
    if not is_dir:
        raise CacheError(f"no cache at {root}", hint="pass --cache-dir, or warm something first")
    if not os.access(root, os.R_OK | os.X_OK):
        raise access_error(root)
    return root


#: What huggingface_hub (``file_download.py``, ``_local_folder.py``, 2.4's ``utils/_shared_blobs.py``) and
#: transformers (``utils/hub.py``: ``version.txt``) write at a cache's root besides repo folders: one makes a cache.
CACHE_MARKERS = frozenset({".locks", "CACHEDIR.TAG", "version.txt", STORE_DIR})
#: What a fresh file system volume holds before anything is written to it: still an empty cache.
_FRESH_VOLUME = frozenset({"lost+found"})
#: What huggingface_hub (``constants.py``) and its neighbours (datasets, evaluate, transformers) keep in an HF_HOME.
_HF_HOME_NAMES = frozenset({"hub", "token", "stored_tokens", "xet", "assets", "datasets", "modules", "accelerate"})
#: At most this many entries of a folder are read to recognise it.
_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class CacheDirKind:
    """What a folder given as a cache (``path``, absolute) is (:func:`describe_cache_dir`): ``kind`` ``"cache"`` (a
    repo folder or one of :data:`CACHE_MARKERS` at its root), ``"empty"`` (at most ``lost+found``), ``"missing"`` or
    ``"not_a_cache"``; ``meant`` (Path | None), the cache probably meant (``path/hub`` for an ``HF_HOME``, a repo
    folder's parent) holding ``meant_repos`` repo folders; ``looks_like`` (str | None): ``"an HF_HOME"``..."""

    path: Path
    kind: str
    meant: Path | None = None
    meant_repos: int = 0
    looks_like: str | None = None

    @property
    def is_cache(self) -> bool:
        """A cache, empty or not: what a reading command may work on."""
        return self.kind in ("cache", "empty")

    def suggestion(self) -> str | None:
        """``"did you mean DIR/hub (it holds 3 repos)?"``, or None when nothing better is known."""
        if self.meant is None:
            return None
        repos = f"{self.meant_repos} repo{'' if self.meant_repos == 1 else 's'}"
        return f"did you mean {self.meant} (it holds {repos})?"

    def error(self) -> CacheError:
        """The one-line error (exit 5) for a folder that is not a cache (``missing`` or ``not_a_cache``)."""
        suggestion = self.suggestion()
        if self.kind == "missing":
            return CacheError(f"no cache at {self.path}: the folder does not exist",
                              hint="pass --cache-dir, or warm something first")
        what = f" ({self.looks_like})" if self.looks_like else ""
        if suggestion:
            return CacheError(f"{self.path} is not a hub cache{what}; {suggestion}",
                              hint=f"pass --cache-dir {self.meant}")
        return CacheError(f"{self.path} is not a hub cache{what}: it holds no models--*, datasets--*, .locks or "
                          "CACHEDIR.TAG", hint="pass the folder that holds the models--ORG--NAME folders as "
                          "--cache-dir (HF_HUB_CACHE, or $HF_HOME/hub)")


def _names(path: Path) -> list[str] | None:
    """The names in folder ``path`` (at most :data:`_MAX_ENTRIES`), None when it is not a folder; CacheError
    (:func:`access_error`) when this user cannot list it."""
    try:
        with os.scandir(path) as entries:
            return [entry.name for entry in itertools.islice(entries, _MAX_ENTRIES)]
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise access_error(path) from None


def _is_cache(names: list[str]) -> bool:
    return any(n.startswith(FOLDER_PREFIXES) or n in CACHE_MARKERS for n in names)


def _repo_count(names: list[str], path: Path) -> int:
    return sum(1 for n in names if n.startswith(FOLDER_PREFIXES) and stat.S_ISDIR(_lstat_mode(path / n)))


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def describe_cache_dir(path: str | os.PathLike[str]) -> CacheDirKind:
    """Recognise a folder given as a hub cache from the names at its root, and name the cache the user probably meant
    when it is not one (:class:`CacheDirKind`). CacheError (exit 5): it (or its ``hub``) exists but cannot be listed."""
    root = Path(path).absolute()
    names = _names(root)
    if names is None:
        kind = "missing" if not os.path.lexists(root) else "not_a_cache"
        return CacheDirKind(root, kind, looks_like=None if kind == "missing" else "not a folder")
    if {"snapshots", "refs"} & set(names) and not any(n.startswith(FOLDER_PREFIXES) for n in names):
        # A repo folder (its blobs/ is no shared store): the cache is the folder above.
        parent = _names(root.parent) or []
        return CacheDirKind(root, "not_a_cache", meant=root.parent, meant_repos=_repo_count(parent, root.parent),
                            looks_like="a repo folder")
    if _is_cache(names):
        return CacheDirKind(root, "cache")
    if not set(names) - _FRESH_VOLUME:
        return CacheDirKind(root, "empty")
    if "hub" in names and stat.S_ISDIR(_lstat_mode(root / "hub")):
        hub = _names(root / "hub")
        if hub is not None and (_is_cache(hub) or not hub):
            return CacheDirKind(root, "not_a_cache", meant=root / "hub", meant_repos=_repo_count(hub, root / "hub"),
                                looks_like="an HF_HOME")
    looks = "an HF_HOME without a hub cache" if set(names) & (_HF_HOME_NAMES - {"hub"}) else None
    return CacheDirKind(root, "not_a_cache", looks_like=looks)


def require_hub_cache(path: str | os.PathLike[str]) -> CacheDirKind:
    """:func:`describe_cache_dir` for a command that reads a cache: a cache or an empty one is returned, else
    CacheError (exit 5): nothing there, not a cache (naming the one probably meant), or not listable."""
    found = describe_cache_dir(path)
    if not found.is_cache:
        raise found.error()
    return found


def refuse_misplaced_cache(path: str | os.PathLike[str], *, empty_ok: bool = True) -> None:
    """The one rule for a cache path: refuse a folder that is another cache's home (an ``HF_HOME``,
    a repo folder), so ``warm --cache-dir $HF_HOME`` writes no second cache beside ``hub/``, ``serve`` serves no
    empty mirror and ``env``/``exec``/``path``/``doctor`` point nothing at it. Raises CacheError (exit 5, the error
    of :meth:`CacheDirKind.error`, naming the cache meant) for such a folder; with ``empty_ok=False`` (commands that
    hand a cache on or read it), for any folder that is no hub cache (an empty or missing one is a new cache)."""
    try:
        found = describe_cache_dir(path)
    except CacheError:
        return  # this user cannot list it: the command's own access checks say so
    if found.kind == "not_a_cache" and (found.meant is not None or not empty_ok):
        raise found.error()


def cache_dir_warning(path: str | os.PathLike[str]) -> str | None:
    """One line for a command that only hands the cache on (``env``, ``exec``): the folder does not exist, or is no
    hub cache (naming the one probably meant); None for a cache, or one this user cannot list (doctor says so)."""
    try:
        found = describe_cache_dir(path)
    except CacheError:
        return None
    if found.kind == "missing":
        return (f"the cache {found.path} does not exist: a program run with these settings finds nothing cached "
                "(warm it first, or check --cache-dir)")
    return None if found.is_cache else found.error().message


def _owner(path: Path) -> tuple[str, os.stat_result | None]:
    try:
        st = os.stat(path)
    except OSError:
        return "", None
    return f" (owned by uid {st.st_uid} gid {st.st_gid}, mode {st.st_mode & 0o7777:04o})", st


def access_error(root: Path) -> CacheError:
    """The one-line error for a cache this user cannot reach or list, naming the folder that blocks it, with the
    fix doctor prints for it (cache.unreachable)."""
    blocker = blocking_dir(root)
    owner, _ = _owner(blocker)
    where = "" if blocker == root else f": {blocker} cannot be entered"
    fix = reach_fix(blocker, blocker == root, os.geteuid(), tuple(os.getgroups()) + (os.getegid(),))
    return CacheError(f"cannot read the cache {root}{where}{owner}: permission denied for uid {os.geteuid()}",
                      hint=f"{fix} (see `hfcache doctor`)")


_WRITE_HINT = ("choose a writable --cache-dir or fix its permissions (`hfcache doctor --cache-dir DIR` names what this "
               "user cannot write, with the fix; shared caches: docs/shared-caches.md)")


def cache_error(exc: OSError, what: str) -> CacheError:
    """Translate an OSError raised while writing the cache into a one-line CacheError."""
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return CacheError(f"{what}: no space left on the device", hint="free disk space or choose another --cache-dir")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CacheError(f"{what}: cannot write {exc.filename or 'the cache'} ({os.strerror(exc.errno)})",
                          hint=_WRITE_HINT)
    return CacheError(f"{what}: {os.strerror(exc.errno) if exc.errno else exc}",
                      hint="check the cache directory")


def ensure_cache_root(cache_dir: Path) -> None:
    """Create the cache root and its ``CACHEDIR.TAG`` (as huggingface_hub does); CacheError when it cannot be
    created or written."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with safefs.dir_fd(cache_dir) as root_fd:  # the tag is written relative to the root's fd, never by path
            try:
                os.stat("CACHEDIR.TAG", dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                atomic_write_at(root_fd, "CACHEDIR.TAG", CACHEDIR_TAG.encode(), policy=cache_policy(cache_dir))
        locks = cache_dir / ".locks"
        if os.path.lexists(locks) and (os.path.islink(locks) or not locks.is_dir()):
            raise safefs.UnsafeLayout(f"{locks} is a symlink or not a directory: left alone",
                                      hint="remove it (it holds only lock files), then rerun")
        if not os.access(cache_dir, os.W_OK):
            read_only = bool(os.statvfs(cache_dir).f_flag & os.ST_RDONLY)
            code = errno.EROFS if read_only else errno.EACCES
            raise OSError(code, os.strerror(code), str(cache_dir))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise write_access_error(cache_dir) from exc
        raise cache_error(exc, f"cache {cache_dir}") from exc


def write_access_error(root: Path) -> CacheError:
    """The one-line error for a cache root this user cannot create or write, naming the folder that blocks it (one
    that cannot be entered, else the nearest existing one that cannot be written), with doctor's fix for it."""
    root = root.absolute()
    existing = root
    while not os.path.isdir(existing) and existing != existing.parent:
        existing = existing.parent
    if blocking_dir(existing) != existing or not os.access(existing, os.R_OK | os.X_OK):
        return access_error(root)
    uid = os.geteuid()
    owner, st = _owner(existing)
    outsider = st is not None and bool(st.st_mode & 0o020) and uid != 0 and \
        st.st_gid not in {*os.getgroups(), os.getegid()}
    what = "write the cache" if existing == root else f"create the cache {root} in"
    hint = join_fix(uid, st.st_gid) if outsider else _WRITE_HINT
    return CacheError(f"cannot {what} {existing}{owner}: permission denied for uid {uid}", hint=hint)


def symlinks_supported(cache_dir: Path) -> bool:
    """Whether snapshot entries can be symlinks in ``cache_dir``: huggingface_hub's ``are_symlinks_supported`` (and
    ``HF_HUB_DISABLE_SYMLINKS``), probed inside ``.locks/`` through its fd, not in a folder a kill would leave."""
    if os.environ.get("HF_HUB_DISABLE_SYMLINKS", "").upper() in ("1", "ON", "YES", "TRUE"):
        return False
    probe = f".hfcache-symlink-probe-{uuid.uuid4().hex[:8]}"
    try:
        fd = open_dirs(cache_dir / ".locks", cache_dir, cache_policy(cache_dir))
    except OSError:
        return False
    try:
        os.symlink("target", probe, dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe, dir_fd=fd)
        os.close(fd)


def find_blob_elsewhere(cache_dir: Path, etag: str, size: int, exclude: str) -> Path | None:
    """A regular ``blobs/<etag>`` of ``size`` bytes in another repo folder of the cache (to hardlink), or the shared
    Xet store's payload such a blob links to (huggingface_hub 2.4's ``blobs/<2hex>/<xet_hash>``); None."""
    check_etag(etag)
    try:
        entries = os.scandir(cache_dir)
    except OSError:
        return None
    with entries:
        for entry in entries:
            if entry.name == exclude or "--" not in entry.name or not entry.is_dir(follow_symlinks=False):
                continue
            candidate = Path(entry.path) / "blobs" / etag
            try:
                # A repo whose blobs/ is a planted link is left alone: its "blob" may be a file outside the cache.
                if not stat.S_ISDIR(os.lstat(candidate.parent).st_mode):
                    continue
                st = os.stat(candidate, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                xet_hash = safefs.store_link_of(cache_dir, entry.name, etag)
                with contextlib.suppress(OSError):
                    if xet_hash is not None and payload_stat(cache_dir, xet_hash).st_size == size:
                        return cache_dir / STORE_DIR / xet_hash[:2] / xet_hash
            elif st.st_size == size and stat.S_ISREG(st.st_mode):
                return candidate
    return None
