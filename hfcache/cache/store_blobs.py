"""A repo's ``blobs/`` as the scan reads it, and a blob that is a symlink: huggingface_hub 2.4's link into the shared
Xet store (:mod:`.shared_store`), or not. Only the library's exact link shape, into a marked store, to a regular
payload, stands for a blob; the payload's ``fstat`` is then the blob's (a payload several repos link to is counted
once by inode, as ``scan_cache_dir`` counts it). Every other link stays "a symlink, not a file".
"""

from __future__ import annotations

import os
import stat

from .shared_store import StoreProblem, payload_stat, xet_hash_of_link


def store_blob_stat(root: str, link_path: str, name: str) -> tuple[os.stat_result | None, str | None]:
    """(payload stat, None) when the symlink ``link_path`` (the repo's ``blobs/<name>``, below the cache ``root``) is
    a healthy store link, else (None, the problem, ``blobs/<name>: ...``)."""
    try:
        target = os.readlink(link_path)
    except OSError:
        return None, f"blobs/{name}: a symlink, not a file"
    xet_hash = xet_hash_of_link(target)
    if xet_hash is None:
        return None, f"blobs/{name}: a symlink, not a file"
    try:
        return payload_stat(root, xet_hash), None
    except FileNotFoundError:
        return None, f"blobs/{name}: store link to a missing payload blobs/{xet_hash[:2]}/{xet_hash} (dangling)"
    except StoreProblem as problem:
        return None, f"blobs/{name}: store link refused: {problem} (left alone)"
    except OSError as exc:
        return None, f"blobs/{name}: store payload unreadable: {exc.strerror}"


def scan_blobs(base: str, entries: list[os.DirEntry], denied: list[str], problems: list[str]
               ) -> tuple[dict[str, os.stat_result], list[str], dict[tuple[int, int], int]]:
    """A repo's ``blobs/`` folder (``entries``: its listing; ``base``: the repo folder) for :func:`.scan.scan_repo`:
    ``denied`` receives ``"blobs/"`` when it can be listed but not searched, ``problems`` what is wrong. Returns
    (name -> lstat of each regular blob, or its payload's; sorted ``.incomplete`` names; (dev, inode) -> size of
    everything that takes space, a shared payload once)."""
    blob_stats: dict[str, os.stat_result] = {}
    incomplete = []
    inodes: dict[tuple[int, int], int] = {}
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed since the listing (a concurrent prune): not part of the cache now
            continue
        except PermissionError:  # listable but not searchable (mode r--)
            denied.append("blobs/")
            break
        if e.name.endswith(".incomplete"):
            incomplete.append(e.name)
            inodes[(st.st_dev, st.st_ino)] = st.st_size
        elif stat.S_ISREG(st.st_mode):
            blob_stats[e.name] = st
            inodes[(st.st_dev, st.st_ino)] = st.st_size
        elif stat.S_ISLNK(st.st_mode):  # huggingface_hub 2.4's shared-store link counts, with its payload's stat
            pst, problem = store_blob_stat(os.path.dirname(base), e.path, e.name)
            if pst is None:
                problems.append(problem)
            else:
                blob_stats[e.name] = pst
                inodes[(pst.st_dev, pst.st_ino)] = pst.st_size
        else:
            problems.append(f"blobs/{e.name}: not a regular file")
    incomplete.sort()
    if incomplete:
        problems.append(f"{len(incomplete)} leftover .incomplete file(s)")
    return blob_stats, incomplete, inodes
