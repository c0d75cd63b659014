"""The child side of ``hfcache check``: load tokenizers offline and report, one JSON line on stdout.

Run as ``python -m hfcache.offline.probe [--trust-remote-code REPO_ID@REVISION]... [--progress FILE]
[--corpus-seconds N] -- TEXT REPO_ID@REVISION...`` (options before ``--``: a TEXT may start with a dash) with the
environment :func:`hfcache.integrity.check.probe_environment` sets. A load or encode that raises or panics is that
spec's ``error``; what no ``except`` sees (a Rust abort, a signal) ends the process: with ``--progress``, each spec's
``{"begin": SPEC}``, ``{"loaded": SPEC, "result": {...}}`` (before the fast-path comparison) and ``{"spec": SPEC,
"result": {...}}`` are appended to FILE first (read by :func:`hfcache.integrity.check_child.probe_specs`). The network
guard (nothing allowed, not even loopback) is installed before transformers is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ..integrity.fast_inputs import is_panic, one_line, reraise_unless_failure
from . import guard as network_guard


def _attempts() -> list[str]:
    """Connection attempts the guard refused so far (libraries may swallow the exception, so look here too)."""
    installed = network_guard.current()
    return installed.attempts if installed is not None else []


def _report(progress: str | None, entry: dict) -> None:
    """Append ``entry`` to the progress file as one JSON line (opened per line: loaded code may close descriptors)."""
    if progress:
        with open(progress, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def probe(text: str, specs: list[str], trusted: frozenset[str] = frozenset(),
          progress: str | None = None, corpus_seconds: float = 60.0) -> dict[str, dict]:
    """Load each ``REPO_ID@REVISION`` with ``AutoTokenizer.from_pretrained`` and encode ``text``; the specs in
    ``trusted`` with ``trust_remote_code=True``; each start, load and result appended to ``progress`` (a file path);
    the fast-path comparison (:func:`fast_path`) of each given ``corpus_seconds``."""
    results: dict[str, dict] = {}
    started = time.perf_counter()
    try:
        from transformers import AutoTokenizer
    except Exception as exc:  # reported to the parent
        return {spec: {"error": f"{type(exc).__name__}: {exc}"} for spec in specs}
    import_seconds = time.perf_counter() - started
    _report(progress, {"import_seconds": round(import_seconds, 4)})
    for spec in specs:
        repo_id, _, revision = spec.partition("@")
        _report(progress, {"begin": spec})
        t0 = time.perf_counter()
        seen = len(_attempts())
        try:
            # Explicit either way: with None, transformers asks on stdin ("Do you wish to run the custom code?").
            tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision or "main",
                                                      trust_remote_code=spec in trusted)
            ids = tokenizer(text)["input_ids"]
            attempts = _attempts()[seen:]
            if attempts:  # it loaded, but only because the library swallowed the refused connection
                raise RuntimeError(f"network access attempted ({attempts[0]}) during an offline load")
            results[spec] = {"class": type(tokenizer).__name__, "vocab_size": len(tokenizer), "input_ids": ids,
                             "seconds": round(time.perf_counter() - t0, 4)}
            _report(progress, {"loaded": spec, "result": results[spec]})  # kept if the comparison is cut short
            results[spec].update(fast_path(tokenizer, repo_id, revision or "main", corpus_seconds))
        except BaseException as exc:  # every failure is data for the parent's diagnosis
            reraise_unless_failure(exc)  # KeyboardInterrupt, SystemExit: the parent names the spec in progress
            # a panic's first line only; at most 2,000 characters (integrity.diagnosis.MAX_ERROR_CHARS)
            error = one_line(exc, 500) if is_panic(exc) else f"{type(exc).__name__}: {exc}"[:2000]
            attempts = _attempts()[seen:]
            if attempts and "network access attempted" not in error:
                error = f"network access attempted ({attempts[0]}) during an offline load; then {error}"
            results[spec] = {"error": error, "seconds": round(time.perf_counter() - t0, 4)}
        _report(progress, {"spec": spec, "result": results[spec]})
    results["__import_seconds__"] = {"seconds": round(import_seconds, 4)}
    return results


def _first_difference(lines: list[str], slow: list[list[int]], fast: list[list[int]]) -> str | None:
    """``differs: ...`` naming the first corpus line whose ids differ and both ids' first 12, else None."""
    for n, (line, a, b) in enumerate(zip(lines, slow, fast, strict=True)):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            start = max(0, at - 2)
            return (f"differs: corpus line {n} {line[:40]!r}: from id {start}, transformers {a[start:start + 12]} "
                    f"vs tokenizers {b[start:start + 12]} ({len(a)} vs {len(b)} ids)")
    return None


def fast_path(tokenizer, repo_id: str, revision: str, seconds: float = 60.0) -> dict:
    """Whether ``hfcache.load_tokenizer(backend="tokenizers")`` gives ``tokenizer``'s ids on the built-in corpus:
    ``{"fast_path": "equal" | "differs: ..." | "refused: <reason>", "commit": str | None}``; a comparison still
    running after ``seconds`` (a regex that backtracks for seconds per encode) stops between lines, ``refused``."""
    from ..integrity.fast_tokenizer import FastPathRefused, NotCached, build
    from ..integrity.tokenizer_corpus import corpus

    try:
        built = build(Path(os.environ["HF_HUB_CACHE"]), repo_id, revision)
    except (FastPathRefused, NotCached) as exc:
        return {"fast_path": f"refused: {exc}", "commit": None}
    except BaseException as exc:  # reported, never fatal to the check
        reraise_unless_failure(exc)
        return {"fast_path": f"refused: {one_line(exc)}", "commit": None}
    added = [t.content for t in built.tokenizer.get_added_tokens_decoder().values()]
    specials = [str(t) for t in getattr(tokenizer, "all_special_tokens", [])]
    lines = corpus([*specials, *added])
    deadline = time.monotonic() + seconds
    slow: list[list[int]] = []
    fast: list[list[int]] = []
    try:
        for line in lines:
            if time.monotonic() > deadline:
                return {"fast_path": f"refused: the comparison on the corpus took over {seconds:g} s (stopped at "
                                     f"line {len(slow)} of {len(lines)})", "commit": None}
            slow.append(list(tokenizer(line)["input_ids"]))
            fast.append(built.tokenizer.encode(line).ids)
    except BaseException as exc:  # an encode that raises or panics is a difference, reported
        reraise_unless_failure(exc)
        return {"fast_path": f"differs: an encode raised {one_line(exc)}", "commit": built.commit}
    return {"fast_path": _first_difference(lines, slow, fast) or "equal", "commit": built.commit,
            "corpus_lines": len(lines)}


def main() -> None:
    network_guard.install(enforce=True)
    parser = argparse.ArgumentParser(prog="python -m hfcache.offline.probe")
    parser.add_argument("text")
    parser.add_argument("specs", nargs="*")
    parser.add_argument("--trust-remote-code", action="append", default=[], metavar="SPEC")
    parser.add_argument("--progress", default=None, metavar="FILE")
    parser.add_argument("--corpus-seconds", type=float, default=60.0, metavar="SECONDS")
    args = parser.parse_args()
    results = probe(args.text, args.specs, frozenset(args.trust_remote_code), args.progress, args.corpus_seconds)
    # On a line of its own: loaded code may have written to stdout without a final newline.
    print("\n" + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
