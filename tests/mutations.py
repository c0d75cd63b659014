"""Type mutations of JSON and TOML documents, and the in-process CLI run, for the type-checking fuzz tests
(tests/integration/test_hub_answer_types.py, tests/integration/test_lock_and_record_types.py).

Deterministic and bounded: every path of a small well-formed document gets each substitute of :data:`JSON_VALUES`
(or :data:`TOML_VALUES`) in turn, and each key is also deleted; no randomness, so a failure names its case and
reproduces. The command runs in-process through :func:`hfcache.cli.main.main`, the function ``python -m hfcache``
runs (exception mapping and exit codes included), so hundreds of cases take seconds; a few cases of each test also
run as real subprocesses (tests/helpers.py ``run_hfcache``).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
from collections.abc import Iterator, Sequence

from hfcache.cli.main import main

DELETE = object()  #: the substitute meaning "remove this key" (or this element)


def _nested(levels: int) -> list:
    value: list = [1]
    for _ in range(levels):
        value = [value]
    return value


#: What stands where a string, a number, an object or an array is due: every JSON type, the integers no size is
#: (negative, past int64, past a float, 400 digits), a float, a huge string, nesting past the 64-level bound.
JSON_VALUES: tuple[object, ...] = (
    None, True, -1, 1.5, 2**64, 10**400, "x", "a" * 5000, [], {"a": {"b": None}}, _nested(70), DELETE,
)
#: TOML has no null; it has dates and times, which no field of a lock or manifest is.
TOML_VALUES: tuple[object, ...] = (
    True, -1, 1.5, 2**63 - 1, "x", "", "a" * 5000, "a\nb\x1b[2K", [], [1, "x"], {"a": {"b": 1}},
    datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.timezone.utc), float("nan"), _nested(70), DELETE,
)


def paths(doc: object, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into ``doc`` (keys and indexes), the root ``()`` first."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from paths(value, (*prefix, index))


def put(doc: object, path: tuple, value: object) -> object:
    """A copy of ``doc`` with ``value`` at ``path`` (:data:`DELETE` removes it)."""
    if not path:
        return value
    out = copy.deepcopy(doc)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


def mutations(doc: object, values: Sequence[object] = JSON_VALUES,
              skip: Sequence[tuple] = ()) -> Iterator[tuple[tuple, object, object]]:
    """``(path, substitute, mutated document)`` for every path of ``doc`` (but the root and ``skip``) and value."""
    for path in paths(doc):
        if not path or path in skip:
            continue
        for value in values:
            yield path, value, put(doc, path, value)


def label(path: tuple, value: object) -> str:
    """A case's name: its path and a short repr of its substitute."""
    shown = "<delete>" if value is DELETE else repr(value)
    return f"{'/'.join(map(str, path))}={shown[:40]}"


def run_cli(args: Sequence[str]) -> tuple[int, str, str]:
    """``hfcache ARGS`` in-process: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def problems(case: str, code: int, stderr: str, allowed: Sequence[int]) -> list[str]:
    """What is wrong with one case's outcome: exit 70 or another code than ``allowed``, a traceback, an internal
    error, an error line that is not one clear line (over 600 characters: a value quoted whole)."""
    found = []
    if code not in allowed:
        found.append(f"{case}: exit {code} (allowed {sorted(allowed)}): {stderr.strip()[:300]}")
    if "Traceback" in stderr or "internal error" in stderr:
        found.append(f"{case}: {stderr.strip()[:300]}")
    found += [f"{case}: a line of {len(line)} characters: {line[:120]}..." for line in stderr.splitlines()
              if len(line) > 600]
    return found
