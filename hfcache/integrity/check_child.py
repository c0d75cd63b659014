"""check_child: start ``check``'s offline probe child and keep it from hanging on what a cache's writers swap in.

The child (``hfcache.offline.probe``) loads tokenizers with huggingface_hub and transformers, which open cache files
with a plain blocking ``open()`` through any link. ``check`` refuses FIFOs, devices and odd links before it starts
the child (``check._hazards``), but a group member of a shared cache can swap a file for a FIFO after that. Two
bounds stand against it:

- the child runs with an audit hook (:data:`LAUNCHER`) that fails at once an ``open`` of a FIFO or device below the
  cache (a ``stat`` before the open: it cannot see a swap between that ``stat`` and the open);
- :func:`run_child` watches the child: a thread of it waiting in the kernel for a FIFO's writer
  (``/proc/<pid>/task/<tid>/wchan`` is ``wait_for_partner``; Linux) for :data:`FIFO_GRACE` seconds, or a child
  still running after the caller's timeout, is killed (:class:`ChildStuck`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: How the child starts: ``python -c LAUNCHER HFCACHE_PARENT CACHE ARG...`` puts the folder this hfcache is imported
#: from on ``sys.path`` (the child runs in a private empty folder, not ``python -m``'s working folder, which could
#: shadow any module), adds the audit hook refusing to open a FIFO or device below the cache, then runs
#: ``hfcache.offline.probe`` as ``python -m`` would.
LAUNCHER = """\
import os, runpy, stat, sys
sys.path[:] = [p for p in sys.path if p not in ('', '.')]
top, cache = sys.argv.pop(1), os.path.join(os.path.abspath(sys.argv.pop(1)), '')
if top not in sys.path:
    sys.path.insert(0, top)
def _refuse_blocking_opens(event, args):
    if event == 'open' and isinstance(args[0], str) and os.path.abspath(args[0]).startswith(cache):
        try:
            mode = os.stat(args[0]).st_mode
        except OSError:
            return
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise OSError(6, 'not a regular file (a FIFO or device): refused', args[0])
sys.addaudithook(_refuse_blocking_opens)
runpy.run_module('hfcache.offline.probe', run_name='__main__', alter_sys=True)
"""

#: Seconds a child thread may wait for a FIFO's writer before the child is killed.
FIFO_GRACE = 5.0


class ChildStuck(Exception):
    """The child was killed: ``reason`` says why (a FIFO open, or the timeout)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _waiting_on_fifo(pid: int) -> bool:
    """Whether a thread of ``pid`` is blocked opening a FIFO (Linux ``wchan``; False where it cannot be read)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan", encoding="ascii", errors="replace") as f:
                if f.read().strip() == "wait_for_partner":
                    return True
        except OSError:
            continue
    return False


def run_child(cache_dir: Path, args: Sequence[str], *, env: dict[str, str], cwd: Path,
              timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the probe child on ``cache_dir`` with ``args`` (its TEXT and specs) and return its completed process.

    Args:
        cache_dir (Path): the cache the audit hook guards; args: the probe's arguments.
        env (dict[str, str]): its environment; cwd (Path): its working folder (private, empty).
        timeout (float): seconds it may run in all.

    Raises:
        ChildStuck: it waited :data:`FIFO_GRACE` s for a FIFO's writer, or ran past ``timeout`` (it is killed).
    """
    top = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, top, str(cache_dir), *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    deadline = time.monotonic() + timeout
    blocked_since: float | None = None
    with proc:
        while True:
            try:
                out, err = proc.communicate(timeout=0.5)
                return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            blocked_since = (blocked_since or now) if _waiting_on_fifo(proc.pid) else None
            if blocked_since is not None and now - blocked_since >= FIFO_GRACE:
                reason = (f"blocked for {FIFO_GRACE:g} s opening a FIFO in the cache (a file swapped for one while "
                          "check ran)")
            elif now >= deadline:
                reason = f"did not finish within {timeout:g} s"
            else:
                continue
            proc.kill()
            proc.communicate()
            raise ChildStuck(reason)
