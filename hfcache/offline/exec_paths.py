"""``hfcache exec --path NAME=REPO_ID[@REVISION][:PATTERN]``: each resolved offline in exec's cache
(:func:`hfcache.offline.paths.resolve`) before the command starts, set as the variable ``NAME`` and put in place of
every ``{NAME}`` in its arguments."""

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
    """Resolve each ``NAME=REPO_ID[@REVISION][:PATTERN]`` in ``cache``, offline, to ``(NAME, absolute path)`` pairs in
    order; ``reserved``: further names a spec may not take. Raises UsageError: a malformed spec, a NAME given twice,
    one hfcache sets or one the system reads (exit 2); PathNotCached, AmbiguousPath: not cached, or a pattern matching
    several files (exit 1); UnsafeLayout, CacheError: the cache's layout is unsafe or unreadable (exit 5)."""
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
    return tuple((name, str(found.one() if pattern is not None else found.snapshot))  # each resolved, then checked
                 for name, (spec, pattern) in parsed for found in (resolve(cache, spec, pattern),))


def substitute_paths(argv: Sequence[str], paths: Mapping[str, str]) -> tuple[str, ...]:
    """``argv`` with every ``{NAME}`` of a NAME in ``paths`` replaced in ``argv[1:]`` (anywhere in an argument), in one
    pass; the program name and other braces are left alone."""
    if not argv:
        return tuple(argv)
    # one pass: a path holding "{OTHER}" (a file name may) is never substituted again
    return (argv[0], *(_TOKEN.sub(lambda m: paths.get(m.group(1), m.group(0)), arg) for arg in argv[1:]))
