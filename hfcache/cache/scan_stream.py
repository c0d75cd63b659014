"""A large cache's listing, one repo at a time: ``ls --json`` over thousands of repos scans and renders them in forked
worker processes, so no process holds the whole listing (goal P4 of docs/benchmarks.md).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from .scan import FolderEntry, RepoInfo, repo_folders, scan_folder

T = TypeVar("T")
#: Repo folders per message from a worker: one pickle, one write and two reads per 32 repos, not per repo (a send
#: per repo was a sixth of the workers' time on 10,000 repos; a chunk of summaries is ~40 KB).
_CHUNK = 32


def stream_repos(root: Path, summarize: Callable[[RepoInfo], T], repo_ids: set[str] | None = None, *,
                 threshold: int = 100, workers: int | None = None) -> Iterator[T] | None:
    """For a cache of more than ``threshold`` repo folders, ``summarize(repo)`` (picklable: it crosses a pipe) of each
    repo, one at a time, in the order ``ls`` shows; None for a smaller cache (:func:`.scan.scan_cache` it whole).
    Scanned in ``workers`` forked processes (default: this process's CPUs, at most 4) where the platform forks and no
    other thread runs (a second core halves it on 10,000 repos), else here; a worker's error is raised here."""
    folders, locks = repo_folders(Path(root), repo_ids)
    if len(folders) <= threshold:
        return None
    folders.sort(key=lambda f: f[1].lower())  # stable over the scan's (repo_type, id) order
    root = Path(root)
    if workers is None:
        try:
            workers = min(len(os.sched_getaffinity(0)), 4)
        except AttributeError:  # not Linux
            workers = min(os.cpu_count() or 1, 4)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        # One process (forking a process with threads is unsafe).
        return (summarize(scan_folder(root, folder, locks)) for folder in folders)
    return _in_workers((str(root), locks, summarize), folders, workers)


def _in_workers(state: tuple[str, dict[str, int] | None, Callable[[RepoInfo], T]], folders: list[FolderEntry],
                workers: int) -> Iterator[T]:
    """``summarize(scan_folder(...))`` over ``folders`` in forked processes, results in order.

    Worker ``k`` takes the chunks of :data:`_CHUNK` consecutive folders ``k, k + workers, ...`` and sends each
    chunk's results as one message down a pipe of its own, read round-robin. Nothing is shared between workers
    (``multiprocessing.Pool``'s result queue lock, held forever by a worker killed mid-write, hung ``ls`` on a group
    SIGTERM). Workers ignore SIGINT and SIGTERM; the parent SIGKILLs them when the iterator ends, is closed or
    raises. ``state`` (root, ``.locks`` listing, summarize) reaches them through the fork, never pickled.
    Raises InternalError: a worker ended without sending its results. What a worker raised, re-raised here."""
    context = multiprocessing.get_context("fork")
    processes, pipes = [], []
    try:
        for k in range(workers):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_worker, args=(writer, [*pipes, reader], state, folders, k, workers),
                                      daemon=True, name=f"hfcache-scan-{k}")
            process.start()
            writer.close()
            processes.append(process)
            pipes.append(reader)
        for i in range(-(-len(folders) // _CHUNK)):
            try:
                results = pipes[i % workers].recv()
            except EOFError as exc:
                from ..errors import InternalError

                raise InternalError(f"a cache scan worker process ended early (exit {processes[i % workers].exitcode})",
                                    hint="it was killed from outside or ran out of memory: run the command again") from exc
            for ok, value in results:
                if not ok:
                    raise value
                yield value
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            process.join()
        for pipe in pipes:
            pipe.close()


def _worker(pipe, inherited: list, state: tuple[str, dict[str, int] | None, Callable[[RepoInfo], object]],
            folders: list[FolderEntry], first: int, step: int) -> None:
    """A forked scan worker: each result of its share of ``folders``, or the first error, sent to the parent; it
    stops as soon as the parent is gone (its pipe breaks, or it was re-parented)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and a group SIGTERM reach every process: the parent
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # handles them and kills its workers
    for other in inherited:  # the parent's reading ends (this worker's and the earlier ones'): held here, they would
        other.close()  # keep a worker from seeing the parent go (a send would block on a full pipe, not fail)
    devnull = os.open(os.devnull, os.O_RDWR)  # the parent's stdin/stdout (a pipe to `head`...): not held here, so
    for fd in (0, 1):  # their reader sees the end as soon as the parent is gone
        os.dup2(devnull, fd)
    os.close(devnull)
    parent = os.getppid()
    root, locks, summarize = state
    try:
        for start in range(first * _CHUNK, len(folders), step * _CHUNK):
            if os.getppid() != parent:
                break
            results = []
            for folder in folders[start:start + _CHUNK]:
                try:
                    results.append((True, summarize(scan_folder(root, folder, locks))))
                except Exception as exc:  # raised again in the parent, as an in-process scan would
                    results.append((False, exc))
                    break
            pipe.send(results)
            if not results[-1][0]:
                break
    except OSError:  # the parent is gone (a closed pipe): nothing to report to, and nobody to read a traceback
        pass
    finally:
        pipe.close()
