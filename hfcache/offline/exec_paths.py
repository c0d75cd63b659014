"""``hfcache exec --path NAME=REPO_ID[@REVISION][:PATTERN]``: each resolved offline in exec's cache
(:func:`hfcache.offline.paths.resolve`) before the command starts, and handed to it as the variable ``NAME`` and in
place of every ``{NAME}`` in its arguments: the snapshot folder, or with a pattern the one file matching it (several
matches, none, or a repo not cached: exit 1, and the command does not start).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import UsageError

#: Variables hfcache sets itself in exec's child (besides the offline variables): a --path may not replace them.
RESERVED = frozenset({"PYTHONPATH"})
RESERVED_PREFIXES = ("HFCACHE_",)
#: Variables the shell, the dynamic loader and interpreters read to find programs, libraries and homes (``--path
#: PATH=...`` made ``echo`` "not found"; ``LD_PRELOAD`` loads the snapshot folder as a library).
SYSTEM = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "IFS", "ENV", "BASH_ENV", "TMPDIR",
                    "TERM", "LANG", "CDPATH", "PS4"})
SYSTEM_PREFIXES = ("LD_", "DYLD_", "PYTHON", "LC_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_")
_TOKEN = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_exec_paths(cache: Path, specs: Iterable[str], reserved: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """Resolve every ``NAME=REPO_ID[@REVISION][:PATTERN]`` of ``specs`` in ``cache`` (absolute), offline, to
    ``(NAME, absolute path)`` pairs in order; ``reserved``: further names a spec may not take (the offline variables).

    Raises:
        UsageError: a malformed spec, a NAME given twice or one hfcache sets itself (exit 2).
        PathNotCached: the repo, revision or a matching file is not in the cache (exit 1, warm hint).
        AmbiguousPath: a pattern matches more than one file (exit 1, naming them).
        UnsafeLayout, CacheError: the cache's layout is unsafe or unreadable (exit 5).
    """
    from .paths import parse_path_var, resolve

    taken = set(RESERVED) | set(reserved)
    parsed = []
    for text in specs:
        name, spec, pattern = parse_path_var(text)
        if name in taken or name.startswith(RESERVED_PREFIXES):
            raise UsageError(f"--path {name}=...: {name} is "
                             f"{'given twice' if name in dict(parsed) else 'set by hfcache exec itself'}",
                             hint="choose another NAME, e.g. MODEL")
        if name in SYSTEM or name.startswith(SYSTEM_PREFIXES):
            raise UsageError(f"--path {name}=...: {name} is read by the shell, the loader or a library, not a name "
                             "for a path", hint="choose another NAME, e.g. MODEL")
        taken.add(name)
        parsed.append((name, (spec, pattern)))
    resolved = []
    for name, (spec, pattern) in parsed:
        found = resolve(cache, spec, pattern)
        resolved.append((name, str(found.one() if pattern is not None else found.snapshot)))
    return tuple(resolved)


def substitute_paths(argv: Sequence[str], paths: Mapping[str, str]) -> tuple[str, ...]:
    """``argv`` with every exact ``{NAME}`` of a NAME in ``paths`` replaced by its path in ``argv[1:]`` (anywhere in
    an argument: ``--model={MODEL}``; the program name and other braces are left alone)."""
    if not argv:
        return tuple(argv)
    def value(match: re.Match[str]) -> str:
        return paths.get(match.group(1), match.group(0))

    # one pass: a path holding "{OTHER}" (a file name may) is never substituted again
    return (argv[0], *(_TOKEN.sub(value, arg) for arg in argv[1:]))
