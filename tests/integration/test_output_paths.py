"""A user's output path that exists as anything but a regular file is never replaced (``cache/atomic.py``
``atomic_output``): ``hfcache export T /dev/null --format tar`` as root renamed a regular file over the device node
(a copy made with mknod here), and ``hfcache lock`` replaced a symlinked lock file with a regular file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.helpers import run_hfcache


@pytest.fixture
def warmed(tmp_path, hub_server) -> Path:
    cache = tmp_path / "cache"
    proc = run_hfcache(["warm", "bert-base-uncased", "--endpoint", hub_server.endpoint, "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stderr
    return cache


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_export_never_replaces_a_device_a_fifo_or_a_link(tmp_path, warmed):
    device, fifo, link = tmp_path / "fakenull", tmp_path / "fifo", tmp_path / "link"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(fifo)
    (tmp_path / "target").write_text("kept")
    link.symlink_to(tmp_path / "target")
    for dest, kind in ((device, "a device"), (fifo, "a FIFO"), (link, "a symbolic link")):
        before = os.lstat(dest)
        proc = run_hfcache(["export", str(dest), "--format", "tar", "--cache-dir", str(warmed)])
        assert proc.returncode == 2, proc.stderr
        assert f"{dest} is {kind}, not a regular file: it is not replaced" in proc.stderr, proc.stderr
        after = os.lstat(dest)
        assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    assert (tmp_path / "target").read_text() == "kept"
    # a regular file is replaced as before
    (tmp_path / "old.tar").write_bytes(b"old")
    assert run_hfcache(["export", str(tmp_path / "old.tar"), "--format", "tar", "--cache-dir",
                        str(warmed)]).returncode == 0
    assert (tmp_path / "old.tar").stat().st_size > 3
