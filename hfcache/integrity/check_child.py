"""check_child: start ``check``'s offline probe child (``hfcache.offline.probe``), keep it from hanging on what a
cache's writers swap in, and keep one repo's crash from taking the others' results.

huggingface_hub and transformers open cache files with a plain blocking ``open()`` through any link; ``check`` refuses
FIFOs, devices and odd links before it starts, but a group member can swap one in later: hence the audit hook
(:data:`LAUNCHER`) and :func:`run_child`'s watch. What the child cannot catch ends it (a Rust abort, a signal, the OOM
killer, ``os._exit``): :func:`probe_specs` reads its progress file and loads the rest in a new child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..bounds import loads_json
from ..errors import InternalError
from .fast_inputs import printable

#: ``python -c LAUNCHER HFCACHE_PARENT CACHE MEMORY ARG...``: the folder this hfcache is imported from on ``sys.path``
#: (not the working folder, which could shadow any module), ``RLIMIT_AS`` at MEMORY bytes (0: none), the audit hook,
#: then ``hfcache.offline.probe`` as ``-m`` runs it.
LAUNCHER = """\
import os, resource, runpy, stat, sys
sys.path[:] = [p for p in sys.path if p not in ('', '.')]
top, cache = sys.argv.pop(1), os.path.join(os.path.abspath(sys.argv.pop(1)), '')
memory = int(sys.argv.pop(1))
if memory:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
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
#: Seconds a child may take to start (import transformers) when each tokenizer's budget is shorter.
START_SECONDS = 60.0
#: What the errors of a spec stopped at its own budget, or at check's overall one, say (``diagnosis`` reads them).
OWN_BUDGET, ALL_TOKENIZERS = "each tokenizer's own budget", "for all tokenizers ran out"


class ChildStuck(Exception):
    """The child was killed: ``reason`` says why; ``timed_out``: at the overall timeout."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.timed_out = reason, timed_out


class Budget:
    """Watches a child's progress file (:func:`run_child`'s ``watch``): the reason to stop it once the spec it began
    last has run past ``seconds`` on this process's clock (its start, before the first: :data:`START_SECONDS` at
    least), else None."""

    def __init__(self, progress: Path, seconds: float) -> None:
        self.progress, self.seconds = progress, seconds
        self.since, self.offset, self.tail, self.current = time.monotonic(), 0, "", None

    def __call__(self) -> str | None:
        try:
            with open(self.progress, encoding="utf-8", errors="replace") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            chunk = ""
        lines = (self.tail + chunk).split("\n")
        self.tail = lines.pop()
        for entry in filter(None, map(_object, lines)):
            if isinstance(entry.get("begin"), str) or isinstance(entry.get("spec"), str):
                self.since, self.current = time.monotonic(), entry.get("begin")
        limit = self.seconds if self.current else max(self.seconds, START_SECONDS)
        if time.monotonic() - self.since <= limit:
            return None
        if self.current:
            return f"the offline load ran past {limit:g} s ({OWN_BUDGET})"
        return f"the probe process did not start within {limit:g} s (importing transformers)"


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


def run_child(cache_dir: Path, args: Sequence[str], *, env: dict[str, str], cwd: Path, timeout: float,
              watch: Callable[[], str | None] | None = None, memory: int = 0) -> subprocess.CompletedProcess[str]:
    """The completed probe child run on ``cache_dir`` (what the audit hook guards) with ``args``, ``env`` and its
    private ``cwd``, under an address-space limit (``RLIMIT_AS``) of ``memory`` bytes (0: none). ChildStuck (it is
    killed): a thread waited :data:`FIFO_GRACE` s for a FIFO's writer (Linux ``wchan`` ``wait_for_partner``),
    ``watch`` (called twice a second) gave a reason to stop it, or it ran past ``timeout`` seconds."""
    top = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, top, str(cache_dir), str(int(memory)), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
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
            fifo = blocked_since is not None and now - blocked_since >= FIFO_GRACE
            over = None if fifo or watch is None else watch()
            if fifo:
                reason = (f"blocked for {FIFO_GRACE:g} s opening a FIFO in the cache (a file swapped for one while "
                          "check ran)")
            elif over is not None:
                reason = over
            elif now >= deadline:
                reason = f"did not finish within {timeout:g} s"
            else:
                continue
            proc.kill()
            proc.communicate()
            raise ChildStuck(reason, timed_out=not fifo and over is None)


#: How :func:`probe_specs` words the error of the spec a child was loading when it died (``diagnosis`` names it).
CRASHED = "the offline load crashed the probe process"


def _stderr_tail(stderr: str) -> str:
    """The last line of a dead child's stderr that says something (before a Rust ``stack backtrace:``; not a
    ``note:`` or a backtrace frame), printable, at most 300 characters; empty when there is none."""
    stderr = stderr.split("\nstack backtrace:", 1)[0]
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith((" ", "\t", "note: "))]
    return printable(lines[-1] if lines else "", 300)


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def _object(line: str) -> dict | None:
    """``line`` parsed as a JSON object (the child's progress and answer lines), else None."""
    try:
        value = loads_json(line, "the offline probe's output")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _read_progress(path: Path) -> tuple[dict[str, dict], str | None, dict | None, float | None]:
    """(spec -> result of the specs the child finished, the spec it began last and did not finish or None, that
    spec's load result when it loaded and only the fast-path comparison was left, its transformers import seconds
    or None) from its progress file; a torn last line is ignored."""
    done: dict[str, dict] = {}
    current = loaded = seconds = None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return done, None, None, None
    for entry in filter(None, map(_object, text.splitlines())):
        if isinstance(entry.get("begin"), str):
            current, loaded = entry["begin"], None
        elif entry.get("loaded") == current and isinstance(entry.get("result"), dict):
            loaded = entry["result"]
        elif isinstance(entry.get("spec"), str) and isinstance(entry.get("result"), dict):
            done[entry["spec"]] = entry["result"]
            current = None if current == entry["spec"] else current
        elif isinstance(entry.get("import_seconds"), (int, float)):
            seconds = float(entry["import_seconds"])
    return done, current, (loaded if current else None), seconds


def _answer(proc: subprocess.CompletedProcess[str]) -> dict | None:
    """The child's JSON answer (its last stdout line: code it ran may have printed before), or None when it did not
    exit 0 with one."""
    lines = proc.stdout.strip().splitlines()
    return _object(lines[-1]) if proc.returncode == 0 and lines else None


def probe_specs(cache_dir: Path, text: str, specs: Sequence[str], trusted: Sequence[str], *, env: dict[str, str],
                cwd: Path, timeout: float, repo_timeout: float | None = None, memory: int = 0) -> dict[str, dict]:
    """Run probe children until every spec has a result, each on the specs not yet done: a spec whose load killed
    its child, or ran past its own budget, fails alone (:data:`CRASHED`, how it ended, its last stderr line; the
    budget), as does the one a stopped child was loading (:class:`ChildStuck`'s reason); one that had loaded keeps
    its result, its fast path ``refused`` with why.

    Args:
        cache_dir, text, specs: the cache, the probe text, ``REPO_ID@REVISION`` to load; trusted: the specs to load
            with ``trust_remote_code=True``. env, cwd: the child's environment and private empty working folder.
        timeout (float): seconds for all children together; specs not begun when it runs out fail with it.
        repo_timeout (float | None): seconds each spec may take from its start (the fast-path comparison: half)
            [default: ``timeout``]. memory (int): each child's ``RLIMIT_AS`` in bytes (0: none).

    Returns spec -> the probe's result (``{"error": ...}`` or the load's), plus ``__import_seconds__``. Raises
    InternalError: a child ended before it began any load (it cannot import hfcache, a bad argument).
    """
    deadline = time.monotonic() + timeout
    budget = repo_timeout or timeout
    results: dict[str, dict] = {}
    import_seconds = None
    pending = list(specs)
    run = 0
    while pending:
        run += 1
        progress = cwd / f"progress-{run}.jsonl"
        options = ["--progress", str(progress), "--corpus-seconds", f"{budget / 2:g}",
                   *[a for s in pending if s in trusted for a in ("--trust-remote-code", s)]]
        left = deadline - time.monotonic()
        stuck = proc = None
        if left > 0:
            try:
                proc = run_child(cache_dir, [*options, "--", text, *pending], env=env, cwd=cwd, timeout=left,
                                 watch=Budget(progress, budget), memory=memory)
            except ChildStuck as exc:
                stuck = exc
        answer = _answer(proc) if proc is not None else None
        if answer is not None:
            import_seconds = import_seconds or answer.pop("__import_seconds__", {}).get("seconds")
            results.update({s: answer.get(s, {"error": "no result"}) for s in pending})
            break
        done, current, loaded, seconds = _read_progress(progress)
        import_seconds = import_seconds or seconds
        results.update({s: r for s, r in done.items() if s in pending})
        results.update(_ended(proc, stuck, current if current in pending else None, loaded,
                              [s for s in pending if s not in results], timeout))
        pending = [s for s in pending if s not in results]
    results["__import_seconds__"] = {"seconds": import_seconds or 0.0}
    return results


def _ended(proc, stuck: ChildStuck | None, current: str | None, loaded: dict | None, left: list[str],
           timeout: float) -> dict[str, dict]:
    """The results a child that ended without its answer leaves: for the spec it was loading (``current``; its
    ``loaded`` result when only the fast-path comparison was left), or when none had begun for every spec ``left``
    (nothing else to blame), or, check's ``timeout`` spent (``proc`` and ``stuck`` None), for every spec left.
    InternalError: the child exited before it began any load."""
    if proc is None and stuck is None:  # nothing left of check's overall budget: the rest never began
        return {s: {"error": f"not loaded: check's {timeout:g} s {ALL_TOKENIZERS} before this load began",
                    "seconds": 0.0} for s in left}
    if stuck is not None:
        why = f"check's {timeout:g} s {ALL_TOKENIZERS}" if stuck.timed_out else stuck.reason
        error = f"not loaded: {why}, so it was stopped"
    elif current is not None:
        tail = _stderr_tail(proc.stderr)
        why = f"the probe process ended, {_how(proc.returncode)}{': ' + tail if tail else ''}"
        error = f"{CRASHED} ({_how(proc.returncode)}){': ' + tail if tail else ''}"
    else:
        tail = _stderr_tail(proc.stderr) or "no output"
        raise InternalError(f"the offline probe process failed ({_how(proc.returncode)}): {tail}")
    if current is not None and loaded is not None:  # the load proved; its fast-path comparison was cut short
        return {current: {**loaded, "commit": None,
                          "fast_path": f"refused: the comparison on the corpus was cut short: {why}"}}
    return {s: {"error": error, "seconds": 0.0} for s in ([current] if current is not None else left)}
