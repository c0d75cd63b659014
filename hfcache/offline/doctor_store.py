"""``hfcache doctor``'s look at huggingface_hub 2.4's shared Xet blob store (``utils/_shared_blobs.py``): whether the
cache has one (``<cache>/blobs`` with its marker ``.huggingface-shared-blobs``), how many payloads it holds and their
bytes, and whether this environment turns it off for huggingface_hub (``HF_HUB_DISABLE_SHARED_BLOBS`` or
``HF_HUB_DISABLE_XET`` read as true: ``constants.py``, ``shared_blobs_enabled``).

Read only, through folder descriptors from the cache root (:mod:`hfcache.cache.shared_store`): no link in the store
is followed; entries named like payloads that are links, FIFOs or folders are reported, not opened.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .findings import Finding, is_true
from ..names import is_sha256
from ..cache.shared_store import DISABLING_VARIABLES, MARKER, STORE_DIR, StoreProblem, open_store_dir

__all__ = ["StoreState", "examine_store"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SHOWN = 3


@dataclass(frozen=True)
class StoreState:
    """The shared store of a cache, as doctor found it.

    Attributes:
        path (str): ``<cache>/blobs``.
        present (bool): something is there (a folder, or a link or file in its place).
        marked (bool): a real folder with the marker huggingface_hub writes (``"1\\n"``): the library uses it.
        payloads (int): regular files named by a 64-hex Xet hash under their 2-hex prefix folder.
        payload_bytes (int): their sizes, summed (each payload once).
        problems (tuple[str, ...]): what is not as the library writes it (an unmarked store, a link or FIFO in
            place of a prefix folder or payload), at most a few.
        disabling_variables (dict[str, str]): those of ``HF_HUB_DISABLE_SHARED_BLOBS``/``HF_HUB_DISABLE_XET`` set in
            the environment, with their values.
        enabled (bool): huggingface_hub would use the store in this environment (neither variable reads as true).
    """

    path: str
    present: bool
    marked: bool
    payloads: int
    payload_bytes: int
    problems: tuple[str, ...]
    disabling_variables: dict[str, str]
    enabled: bool


def examine_store(cache: Path, env: Mapping[str, str]) -> tuple[StoreState, list[Finding]]:
    """The store of ``cache`` and what doctor says about it (``store.present``, ``store.disabled``,
    ``store.unusable``, ``store.hostile``)."""
    set_vars = {name: env[name] for name in DISABLING_VARIABLES if name in env}
    disabled = [name for name, value in set_vars.items() if is_true(value)]
    path = cache / STORE_DIR
    present = os.path.lexists(path)
    marked, count, size, problems = False, 0, 0, []
    try:
        store_fd = open_store_dir(cache)
    except FileNotFoundError:
        store_fd = None
    except (OSError, StoreProblem) as exc:
        store_fd = None
        problems.append(str(exc))
    if store_fd is not None:
        marked = True
        try:
            count, size = _payloads(store_fd, path, problems)
        finally:
            os.close(store_fd)
    state = StoreState(path=str(path), present=present, marked=marked, payloads=count, payload_bytes=size,
                       problems=tuple(problems[:_SHOWN]), disabling_variables=set_vars, enabled=not disabled)
    return state, _findings(state, disabled)


def _payloads(store_fd: int, path: Path, problems: list[str]) -> tuple[int, int]:
    """(count, bytes) of the payloads below the store's fd; entries of the wrong kind go to ``problems``."""
    count = size = 0
    try:
        with os.scandir(store_fd) as it:
            prefixes = [e.name for e in it if len(e.name) == 2 and all(c in "0123456789abcdef" for c in e.name)]
    except OSError as exc:
        problems.append(f"{path} cannot be listed ({exc.strerror})")
        return 0, 0
    for prefix in sorted(prefixes):
        try:
            prefix_fd = os.open(prefix, _DIR_FLAGS, dir_fd=store_fd)
        except OSError:
            problems.append(f"{path}/{prefix} is a symlink or not a folder")
            continue
        try:
            with os.scandir(prefix_fd) as it:
                for e in it:
                    if not is_sha256(e.name) or not e.name.startswith(prefix):
                        continue
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        count += 1
                        size += st.st_size
                    else:
                        problems.append(f"{path}/{prefix}/{e.name} is not a regular file (a link, FIFO or folder)")
        except OSError as exc:
            problems.append(f"{path}/{prefix} cannot be listed ({exc.strerror})")
        finally:
            os.close(prefix_fd)
    return count, size


def _findings(state: StoreState, disabled: list[str]) -> list[Finding]:
    findings = []
    if state.marked:
        findings.append(Finding("store.present", "info",
                                f"shared Xet blob store {state.path}: {state.payloads} payload(s), "
                                f"{state.payload_bytes} bytes (huggingface_hub 2.4 keeps each Xet file once per "
                                "cache; repo blobs link to it)"))
    elif state.present:
        findings.append(Finding("store.unusable", "warning",
                                f"{state.path} is not a shared blob store huggingface_hub uses: "
                                f"{'; '.join(state.problems) or 'no ' + MARKER}",
                                f"remove {state.path} if nothing there is yours (huggingface_hub never adopts an "
                                "unmarked folder)"))
    if state.marked and state.problems:
        findings.append(Finding("store.hostile", "warning",
                                f"entries of the shared store that are not what huggingface_hub writes: "
                                f"{'; '.join(state.problems)}", "remove them; hfcache never follows them"))
    if disabled:
        shown = ", ".join(f"{name}={state.disabling_variables[name]}" for name in disabled)
        findings.append(Finding("store.disabled", "info",
                                f"{shown}: huggingface_hub does not use the shared Xet blob store in this environment "
                                "(new downloads are plain repo blobs; links already in the cache still load)",
                                None))
    return findings
