"""Where transformers copies custom code before importing it (``HF_MODULES_CACHE``, transformers 5.24
``utils/hub.py``; written by every load of custom code, even offline), the private folder ``env``/``exec`` point it at
when the default cannot be written (docs/offline.md), and which cached revisions name custom code.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..cache import fsops, safefs
from ..errors import CacheError
from ..names import parse_folder_name
from .custom_code import MAX_PARSE_BYTES, auto_map_refs, module_path
from .selection import AUTO_MAP_FILES

ENV_NAME = "HF_MODULES_CACHE"


def hf_home(environ: Mapping[str, str]) -> Path:
    """huggingface_hub ``constants.HF_HOME`` in ``environ``: ``HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
    ``~/.cache/huggingface``, expanded as constants.py does."""
    default = os.path.join(environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
                           "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(environ.get("HF_HOME", default))))


def modules_cache(environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The folder transformers copies custom code into in ``environ``, and whether ``HF_MODULES_CACHE`` chose it
    (transformers 5.24 ``utils/hub.py``)."""
    if ENV_NAME in environ:
        return Path(os.path.expanduser(environ[ENV_NAME])), True
    return hf_home(environ) / "modules", False


def can_create(path: Path) -> bool:
    """Whether this user can write (or create) the folder ``path``: ``os.access`` on its nearest existing part
    (False on a read-only filesystem, for root too)."""
    probe = path
    while not probe.exists():
        if probe == probe.parent:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


def private_modules_dir(tmp: str | None = None) -> Path:
    """``<tmp>/hfcache-modules-<uid>``, a folder only this user can write (created, or made again, 0700). Raises
    CacheError: a link, not a folder, or another user's (code planted there would be imported); OSError."""
    base = tmp or tempfile.gettempdir()
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    path = Path(base) / f"hfcache-modules-{uid}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    # Judged and chmod-ed through one descriptor that followed no link: in a TMPDIR others can write (no sticky bit)
    # they could swap the name for a link between a check and a chmod by path (which would chmod the link's target).
    try:
        fd = fsops.open_dir_at(None, str(path))
    except OSError as exc:
        if exc.errno not in fsops.LINK_ERRNOS:
            raise
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = 0
        what = "a link" if exc.errno == errno.ELOOP or stat.S_ISLNK(mode) else \
            "not a folder" if mode and not stat.S_ISDIR(mode) else "a link or not a folder"  # (it changed again)
        raise _not_private(path, what, uid) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != uid:
            raise _not_private(path, f"owned by uid {st.st_uid}", uid)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)  # ours, but others could plant code in it: private again
    finally:
        os.close(fd)
    return path


def _not_private(path: Path, what: str, uid: int) -> CacheError:
    return CacheError(f"{path} is {what}, not a private folder of uid {uid}: hfcache will not point "
                      "HF_MODULES_CACHE there (transformers imports the code it finds in it)",
                      hint=f"remove {path}, or export HF_MODULES_CACHE=<a folder only you can write>")


def modules_cache_override(environ: Mapping[str, str]) -> Path | None:
    """The ``HF_MODULES_CACHE`` ``env``/``exec`` set for ``environ``: None when it names one or its default can be
    written, else :func:`private_modules_dir` (in its ``TMPDIR``; CacheError as there)."""
    path, explicit = modules_cache(environ)
    if explicit or can_create(path):
        return None
    return private_modules_dir(environ.get("TMPDIR") or None)


@dataclass(frozen=True)
class CustomCodeRepo:
    """A cached revision whose configs' ``auto_map`` names custom code (``refs``: ``module.Class``), or whose config
    cannot be parsed (``error``)."""

    repo_id: str
    commit_hash: str
    refs: tuple[str, ...]
    error: str | None = None


def sanitize_module_name(name: str) -> str:
    """transformers 5.24 ``dynamic_module_utils._sanitize_module_name``: a repo id part as a Python module name."""
    new_name = name.replace(".", "_dot_").replace("-", "_hyphen_")
    return f"_{new_name}" if new_name and new_name[0].isdigit() else new_name


def holds_code(modules_dir: Path, repo: CustomCodeRepo) -> bool:
    """Whether ``modules_dir`` already holds the copies transformers would make for ``repo`` (a file already there is
    not copied again: ``dynamic_module_utils.get_cached_module_file``)."""
    modules = {m for m in (module_path(r) for r in repo.refs) if m}
    if not modules or len(modules) != len(repo.refs):
        return False  # nothing to look for, or code in another repo (its own folder)
    folder = modules_dir / "transformers_modules"
    for part in repo.repo_id.split("/"):
        folder = folder / sanitize_module_name(part)
    folder = folder / repo.commit_hash
    # os.path.isfile: False on any OSError (pathlib's is_file raises PermissionError in an unreadable folder)
    return os.path.isfile(folder / "__init__.py") and all(os.path.isfile(folder / m) for m in modules)


def custom_code_repos(cache_dir: Path) -> list[CustomCodeRepo]:
    """Every cached model revision whose ``tokenizer_config.json`` or ``config.json`` has an ``auto_map``; unreadable
    files are skipped, unparsable ones reported (``error``)."""
    found = []
    for folder in fsops.list_entries(cache_dir):
        parsed = parse_folder_name(folder.name) if folder.name.startswith("models--") else None
        if parsed is None or not folder.is_dir(follow_symlinks=False):
            continue
        for snapshot in fsops.list_entries(os.path.join(folder.path, "snapshots")):
            if not snapshot.is_dir(follow_symlinks=False):
                continue
            try:
                refs = _auto_map_of(snapshot.path)
            except ValueError as exc:  # custom_code.RepoDataError: reported, the scan goes on
                found.append(CustomCodeRepo(parsed[0], snapshot.name, (), error=str(exc)))
                continue
            if refs:
                found.append(CustomCodeRepo(parsed[0], snapshot.name, refs))
    return sorted(found, key=lambda r: (r.repo_id, r.commit_hash))


def _auto_map_of(snapshot: str) -> tuple[str, ...]:
    refs: list[str] = []
    for name in AUTO_MAP_FILES:
        try:
            # Regular files only, never through a link leaving the repo folder, never blocking on a FIFO.
            data = safefs.read_snapshot_file(snapshot, name, MAX_PARSE_BYTES)
        except (OSError, safefs.UnsafeLayout):
            continue
        if data is None or b"auto_map" not in data:  # no JSON parse for the common case
            continue
        refs += [r for r in auto_map_refs(name, data, kind="all") if r not in refs]
    return tuple(refs)
