"""``hfcache doctor``'s runtime traps: what goes wrong later, in the application, though every load works today
(docs/offline.md, "Two runtime traps"): ``cache.read_only_online`` and ``umask.not_shared``. Reads only."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..cache.sharing import policy_of
from ..names import is_commit
from .doctor_settings import Finding

_SHOWN = 5
_WRITE = os.W_OK | os.X_OK


def _inert(name: str, limit: int = 100) -> str:
    """A name the cache supplied as one short inert line (non-printables escaped, cut to ``limit``)."""
    text = "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in name)
    return text if len(text) <= limit else text[:limit] + "..."


def _repo_writable(cache: Path, folder: str) -> bool:
    """Whether this user can write what a download of ``folder`` writes (its folders and its lock folder)."""
    base = cache / folder
    parts = [base / name for name in ("blobs", "snapshots", "refs") if os.path.lexists(base / name)]
    locks = next(p for p in (cache / ".locks" / folder, cache / ".locks", cache) if os.path.lexists(p))
    return all(os.access(p, _WRITE) for p in [base, *parts, locks])


def read_only_online_findings(cache: Path, repos: Sequence, *, offline: bool,
                              read_only_fs: bool | None) -> list[Finding]:
    """``cache.read_only_online``: one error naming ``cache`` and up to 5 of ``repos`` (scan records) with their movable
    refs; nothing when ``offline``, the cache is writable, or no ref can move. ``read_only_fs``: ``ST_RDONLY``."""
    if offline:
        return []
    if not read_only_fs and os.access(cache, _WRITE):
        return []  # writable at the root: a repo folder this user cannot write is cache.repo_not_writable's
    # the refs that can move upstream (names that are no commit); below a planted link nothing was read
    trapped = [(r.repo_id, refs) for r in repos if not r.unsafe
               and (refs := sorted(n for n in r.refs if not is_commit(n)))
               and (read_only_fs or not _repo_writable(cache, r.folder))]
    if not trapped:
        return []
    shown = "; ".join(", ".join(f"{_inert(repo_id)}@{_inert(ref)}" for ref in refs[:3])
                      + (f" (and {len(refs) - 3} more refs)" if len(refs) > 3 else "")
                      for repo_id, refs in trapped[:_SHOWN])
    more = f" (and {len(trapped) - _SHOWN} more)" if len(trapped) > _SHOWN else ""
    uid = os.geteuid() if hasattr(os, "geteuid") else "?"
    why, failure = (("on a read-only filesystem", "OSError [Errno 30] Read-only file system, which transformers "
                     ">= 5.24 raises instead of returning the stale cached file (huggingface/transformers#47852)")
                    if read_only_fs else
                    (f"not writable by uid {uid}", "PermissionError (transformers: 'PermissionError at ... when "
                     "downloading')"))
    return [Finding(
        "cache.read_only_online", "error",
        f"the cache {cache} is {why} and offline mode is off, and {len(trapped)} cached repo(s) are known by a "
        f"revision that can move upstream (a branch or tag under refs/): {shown}{more}; every load asks the Hub what "
        f"that revision is now, and once upstream moves it must download the new commit into this cache and fails "
        f"with {failure}",
        f'run the application offline: eval "$(hfcache env --cache-dir {cache})" (or hfcache exec --cache-dir '
        f"{cache} -- COMMAND); or pin: load each repo by commit (revision=<commit> from `hfcache lock`) and build "
        "the cache with hfcache warm REPO@COMMIT, which leaves no ref that can move")]


def _shared_targets(cache: Path, env: Mapping[str, str], offline: bool) -> list[tuple[str, Path]]:
    """(what, path) of the folders an application started from ``env`` writes into (the hub cache only online)."""
    from ..warming.modules_cache import hf_home, modules_cache

    home = hf_home(env)
    targets = [] if offline else [("the hub cache", cache)]
    targets.append(("HF_MODULES_CACHE (custom code)", modules_cache(env)[0]))
    for name, default in (("HF_DATASETS_CACHE", home / "datasets"), ("HF_XET_CACHE", home / "xet")):
        targets.append((name, Path(os.path.expanduser(env[name])) if name in env else default))
    return targets


def _dropped_bits(path: Path, umask: int) -> tuple[int, os.stat_result] | None:
    """(write bits ``umask`` removes, stat) of the shared folder ``path`` this user writes, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or policy_of(st.st_mode, st.st_gid) is None or not os.access(path, _WRITE):
        return None
    dropped = umask & st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return (dropped, st) if dropped else None


def umask_findings(cache: Path, env: Mapping[str, str], offline: bool, umask: int | None) -> list[Finding]:
    """At most one ``umask.not_shared`` (warning) or ``umask.not_shared_offline`` (info) finding naming each shared
    folder losing write; none when ``umask`` is None. ``env``, ``offline``: the judged environment and its mode."""
    if umask is None:
        return []
    hits, seen = [], set()
    for what, path in _shared_targets(cache, env, offline):
        real = os.path.realpath(path)
        if real in seen or (found := _dropped_bits(path, umask)) is None:
            continue
        seen.add(real)
        hits.append((what, path, *found))
    if not hits:
        if not offline or (found := _dropped_bits(cache, umask)) is None:
            return []
        return [Finding("umask.not_shared_offline", "info",
                        f"your umask {umask:04o} drops write for the members of the group-shared cache {cache}: "
                        "harmless offline (huggingface_hub writes nothing there), but a download run with this umask "
                        "(online) leaves folders the others cannot write", _umask_fix(umask, found[0]))]
    dropped = 0
    for *_, bits, _st in hits:
        dropped |= bits
    shown = "; ".join(f"{what} {path} (gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o})"
                      for what, path, _bits, st in hits)
    whom = "the group" + (" and others" if dropped & stat.S_IWOTH else "") if dropped & stat.S_IWGRP else "others"
    return [Finding(
        "umask.not_shared", "warning",
        f"your umask {umask:04o} drops write for {whom} in the shared folder(s) {shown}: what this process creates "
        "there (huggingface_hub downloads: folders and blobs follow the umask; transformers' custom-code copies; "
        "datasets' files) cannot be written by the other members, whose next download of the same repo fails with "
        "PermissionError (huggingface/datasets#7900); hfcache's own commands share what they create whatever the umask",
        _umask_fix(umask, dropped))]


def _umask_fix(umask: int, dropped: int) -> str:
    wanted = umask & ~dropped
    return (f"set umask {wanted:03o} before the application starts: in the image's entrypoint (`umask {wanted:03o}` "
            f"then `exec \"$@\"`), or as the command (sh -c 'umask {wanted:03o} && exec python app.py'); "
            "Kubernetes has no umask setting (securityContext.fsGroup sets the group, not the mode bits), so it "
            "must be the entrypoint; or run downloads with hfcache warm, which shares what it creates")
