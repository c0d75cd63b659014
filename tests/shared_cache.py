"""A group-shared cache (the documented recipe) and a member of its group racing root in it.

The cache is root-owned, group ``GROUP``, ``2775`` (setgid, group-writable), so every folder root walks can be swapped
by a member between a check and a use. ALICE (a member, another uid through ``setpriv``, tests/users.py) runs
:data:`SWAP`, a loop of ``renameat2(RENAME_EXCHANGE)`` (ctypes, standard library only), for a bounded number of rounds
while root runs the real command. :func:`make_export` and :func:`export_tar` build what root imports: repos that all
hold the same blob.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from tests.users import ALICE, GROUP, Runtime

COMMITS = [f"{i:x}" * 40 for i in range(1, 10)]


SHARED = b"shared weights " * 70_000  # ~1 MiB: every repo holds it (what export and push --layers single write)


#: The member's swap loop (run as ALICE). argv: a JSON spec {"stop": path, "rounds": n, "hold": seconds,
#: "exchange": [[path, target, after?]], "plant": [[path, target, after]]}. Each round, every "plant" path that is
#: missing becomes a symlink to its target once ``after`` exists (or at once); then every "exchange" path that exists
#: (once its optional ``after`` exists) is
#: exchanged atomically with a symlink to its target, held ``hold`` seconds and exchanged back. At the end the member
#: puts everything back (exchanged names restored, planted links removed), so the cache can be verified.
SWAP = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2

def exchange(a, b):
    return libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0

spec = json.loads(sys.argv[1])
hold = spec.get("hold", 0.002)
hits = 0
for n in range(spec["rounds"]):
    if os.path.exists(spec["stop"]):
        break
    for path, target, after in spec["plant"]:
        if (not after or os.path.lexists(after)) and not os.path.lexists(path):
            try:
                os.symlink(target, path)
            except OSError:
                pass
    swapped = []
    for path, target, *after in spec["exchange"]:
        if after and not os.path.lexists(after[0]):
            continue
        link = os.path.join(os.path.dirname(path), f".swap-{os.getpid()}-{len(swapped)}")
        try:
            os.symlink(target, link)
        except OSError:
            continue
        if exchange(link, path):
            hits += 1
            swapped.append((link, path))
        else:
            os.unlink(link)
    if swapped:
        time.sleep(hold)  # most of the time the name is the member's link; back for a moment
    for link, path in swapped:
        exchange(link, path)
        try:
            os.unlink(link)
        except OSError:
            pass
for path, target, after in spec["plant"]:
    try:
        if os.readlink(path) == target:
            os.unlink(path)
    except OSError:
        pass
print(hits)
"""


def shared_cache(runtime: Runtime, name: str) -> Path:
    """The documented recipe: root-owned, ``chgrp GROUP``, ``chmod 2775``."""
    cache = runtime.base / name
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)
    return cache


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_export(root: Path, repos: int) -> list[str]:
    """An exported cache (the layout ``hfcache export`` writes) of ``repos`` repos that all hold the same weights
    blob, each with a config, a ref ``main`` to its commit (``COMMITS[i]``) and a ``trees/`` listing. Returns the
    repo folder names."""
    names = []
    for i in range(repos):
        commit = COMMITS[i]
        base = root / f"models--org--r{i}"
        names.append(base.name)
        config = json.dumps({"model_type": "bert", "repo": i}).encode()
        files = {"config.json": config, "model.bin": SHARED}
        (base / "blobs").mkdir(parents=True)
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text(commit)
        (base / "trees").mkdir()
        snap = base / "snapshots" / commit
        snap.mkdir(parents=True)
        listing = {}
        for path, data in files.items():
            (base / "blobs" / sha256(data)).write_bytes(data)
            os.symlink(f"../../blobs/{sha256(data)}", snap / path)
            pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(data)}\n"
                       f"size {len(data)}\n").encode()
            listing[path] = {"size": len(data), "blob_id": git_sha1(pointer), "lfs_sha256": sha256(data),
                             "lfs_size": len(data)}
        (base / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    return names


def export_tar(source: Path, tar_path: Path) -> Path:
    """The export ``source`` as the tar ``hfcache export`` writes: a blob another repo already holds is a hardlink
    member to that first copy (so import stages it once and publishes it by hardlink, or by copy where that fails)."""
    import tarfile

    first: dict[str, str] = {}
    with tarfile.open(tar_path, "w") as tar:
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source).as_posix()
            parts = rel.split("/")
            if len(parts) == 3 and parts[1] == "blobs" and parts[2] in first:
                info = tarfile.TarInfo(rel)
                info.type, info.linkname = tarfile.LNKTYPE, first[parts[2]]
                tar.addfile(info)
                continue
            if len(parts) == 3 and parts[1] == "blobs":
                first[parts[2]] = rel
            tar.add(path, arcname=rel, recursive=False)
    return tar_path


def member_swaps(runtime: Runtime, spec: dict) -> subprocess.Popen[str]:
    return subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", SWAP, json.dumps(spec)], cwd=runtime.base,
                            env=runtime.env(ALICE), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.umask(0o002))


def stop_member(member: subprocess.Popen[str], stop: Path) -> int:
    """Stop the member's loop; return how many swaps it made."""
    stop.touch()
    out, err = member.communicate(timeout=60)
    assert member.returncode == 0, err
    return int(out.strip() or 0)


def one_line_outcome(proc: subprocess.CompletedProcess[str], allowed: dict[int, tuple[str, ...]]) -> None:
    """The command ended with an exit code of ``allowed`` (code -> substrings one of which its stderr shows),
    never a traceback or an internal error (exit 70)."""
    assert proc.returncode != 70 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in allowed, (proc.returncode, proc.stdout, proc.stderr)
    if proc.returncode and proc.stderr.strip():
        line = proc.stderr.strip().splitlines()[0]
        assert line.startswith("hfcache: error: ") and any(s in line for s in allowed[proc.returncode]), proc.stderr
    elif proc.returncode:  # prune's report: the failed items are named on stdout, one line each
        assert any(s in proc.stdout for s in allowed[proc.returncode]), proc.stdout
