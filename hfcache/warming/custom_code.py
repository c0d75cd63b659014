"""What reading a repo's configs adds to a selection: custom code named by ``auto_map`` and, recursively, the modules
it imports relatively, found as transformers' ``dynamic_module_utils`` finds them (never executed); for
``kind="model"``, the sentence-transformers module folders ``modules.json`` names.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..bounds import TooDeep, loads_json
from ..errors import IntegrityError
from ..records import UnsafePath, WarmRequest, validate_repo_path
from .selection import AUTO_MAP_FILES, MODULES_FILE, Selection, matches, model_paths

#: Configs and code files larger than this are not parsed (readers return None; :attr:`CustomCode.unparsed`).
MAX_PARSE_BYTES = 16 * 1024 * 1024
#: The ``auto_map`` keys of a tokenizer load, per file (transformers 5.24 ``models/auto/tokenization_auto.py``:
#: ``AutoTokenizer`` of ``tokenizer_config.json``, a dict entry or the legacy list, after ``AutoConfig`` of
#: ``config.json``, ``models/auto/configuration_auto.py``; ``config.json``'s ``AutoTokenizer``: transformers 4.x).
_TOKENIZER_AUTO_KEYS = {"tokenizer_config.json": ("AutoTokenizer",), "config.json": ("AutoConfig", "AutoTokenizer")}


def auto_map_refs(config_path: str, config_bytes: bytes, kind: str = "tokenizer") -> tuple[str, ...]:
    """The class references (``module.ClassName``, ``org/repo--module.ClassName``) a config's ``auto_map`` names, in
    file order, without duplicates: for ``kind="tokenizer"`` only the keys a tokenizer load uses, else every key.
    Raises RepoDataError: nested deeper than :data:`hfcache.bounds.MAX_JSON_DEPTH`, larger than MAX_PARSE_BYTES."""
    if len(config_bytes) > MAX_PARSE_BYTES:
        raise RepoDataError(f"{config_path} is larger than {MAX_PARSE_BYTES} bytes: not parsed")
    try:
        auto_map = loads_json(config_bytes, config_path).get("auto_map")
    except TooDeep:
        raise RepoDataError(f"{config_path} is JSON nested too deeply to parse") from None  # > MAX_JSON_DEPTH
    except (ValueError, AttributeError, TypeError, OverflowError):
        return ()
    if isinstance(auto_map, list):  # legacy tokenizer_config form: [slow, fast]
        auto_map = {"AutoTokenizer": auto_map}
    if not isinstance(auto_map, dict):
        return ()
    keys = _TOKENIZER_AUTO_KEYS.get(config_path, ()) if kind == "tokenizer" else tuple(auto_map)
    refs: list[str] = []
    for key in keys:
        value = auto_map.get(key)
        for ref in value if isinstance(value, list) else [value]:
            if isinstance(ref, str) and ref and ref not in refs:
                refs.append(ref)
    return tuple(refs)


def module_path(class_ref: str) -> str | None:
    """The repo path of a class reference's module, as transformers' ``get_class_from_dynamic_module`` derives it;
    None for a reference into another repo (``org/repo--module.Class``) or one transformers could not load."""
    if "--" in class_ref:
        return None
    parts = class_ref.split(".")
    if len(parts) != 2 or not all(parts):
        return None
    try:
        return validate_repo_path(parts[0] + ".py")
    except UnsafePath:
        return None


#: transformers 5.24 ``dynamic_module_utils.get_relative_imports``'s two regexes over a code file's text (a docstring
#: line that looks like an import counts too): ``^\s*import\s+\.(\S+)\s*$`` and ``^\s*from\s+\.(\S+)\s+import``
#: (MULTILINE), with ``[^\S\n]*`` for the leading ``\s*``: the same captures, without its quadratic time on a file of
#: blank lines (40,000 lines: 34 s).
_RELATIVE_IMPORT_RES = (re.compile(r"^[^\S\n]*import\s+\.(\S+)\s*$", re.MULTILINE),
                        re.compile(r"^[^\S\n]*from\s+\.(\S+)\s+import", re.MULTILINE))


def relative_imports(source: bytes, path: str) -> tuple[str, ...]:
    """The safe repo paths of the modules a custom-code file imports relatively (``from .NAME import`` is
    ``<folder>/NAME.py``), by :data:`_RELATIVE_IMPORT_RES` and an ``ast`` walk (statements after ``;``)."""
    text = source.decode("utf-8", errors="replace")
    names = [m.group(1) for regex in _RELATIVE_IMPORT_RES for m in regex.finditer(text)]
    try:
        tree = ast.parse(source, filename=path)
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass  # the regexes still apply: transformers reads the text the same way before the import fails
    folder = posixpath.dirname(path)
    found: set[str] = set()
    for name in names:
        try:
            found.add(validate_repo_path(posixpath.join(folder, name + ".py")))
        except UnsafePath:
            continue
    return tuple(sorted(found))


@dataclass(frozen=True)
class CustomCode:
    """The custom code a repo's configs name, each sorted: ``paths`` to fetch; ``absent``, named but missing
    (``.no_exist`` markers: an offline load fails at once); ``foreign`` class references into other repos (not
    fetched); ``unparsed`` files larger than :data:`MAX_PARSE_BYTES` (not followed)."""

    paths: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    foreign: tuple[str, ...] = ()
    unparsed: tuple[str, ...] = ()


def foreign_repos(refs: Iterable[str]) -> tuple[str, ...]:
    """The repo ids of class references into other repos (``org/repo--module.Class`` -> ``org/repo``), sorted."""
    return tuple(sorted({r.split("--", 1)[0] for r in refs if "--" in r}))


def custom_code_paths(configs: Iterable[str], read: Callable[[str], bytes | None], available: Iterable[str],
                      kind: str = "tokenizer", exclude: Sequence[str] = ()) -> CustomCode:
    """Follow ``auto_map`` from ``configs`` to the Python files a load runs: ``read(path)`` gives a file's bytes (None
    above :data:`MAX_PARSE_BYTES`); ``exclude`` globs are never fetched nor marked. RepoDataError: nested too deep."""
    have = set(available)
    unparsed: list[str] = []

    def parse(path: str, parser: Callable[[bytes], Iterable[str]]) -> list[str]:
        if (data := read(path)) is None:
            unparsed.append(path)
            return []
        return list(parser(data))

    refs = [ref for config in configs if config in have
            for ref in parse(config, lambda data, c=config: auto_map_refs(c, data, kind))]
    queue = sorted({m for m in (module_path(r) for r in refs) if m})
    seen: set[str] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        if path in have and not (exclude and matches(path, exclude)):
            queue.extend(p for p in parse(path, lambda data, p=path: relative_imports(data, p)) if p not in seen)
    kept = {p for p in seen if not (exclude and matches(p, exclude))}
    return CustomCode(paths=tuple(sorted(kept & have)), absent=tuple(sorted(kept - have)),
                      foreign=tuple(sorted({r for r in refs if "--" in r})), unparsed=tuple(sorted(unparsed)))


def module_folder_paths(modules_bytes: bytes, available: Iterable[str]) -> tuple[set[str], tuple[str, ...]]:
    """``(paths, index_files)`` a sentence-transformers load reads from the folders ``modules.json`` names: per folder,
    what the root's rules select. Raises RepoDataError: nested too deeply, or larger than :data:`MAX_PARSE_BYTES`."""
    if len(modules_bytes) > MAX_PARSE_BYTES:
        raise RepoDataError(f"{MODULES_FILE} is larger than {MAX_PARSE_BYTES} bytes: not parsed")
    try:
        modules = loads_json(modules_bytes, MODULES_FILE)
        folders = [m["path"] for m in modules if isinstance(m, dict) and isinstance(m.get("path"), str)]
    except TooDeep:
        raise RepoDataError(f"{MODULES_FILE} is JSON nested too deeply to parse") from None  # > MAX_JSON_DEPTH
    except (ValueError, TypeError, OverflowError):
        return set(), ()
    have = set(available)
    chosen: set[str] = set()
    indexes: list[str] = []
    for folder in folders:
        folder = folder.strip("/")
        if folder in ("", "."):
            continue  # the root: selected by select() already
        try:
            validate_repo_path(folder)
        except UnsafePath:
            continue
        inside = {p[len(folder) + 1:] for p in have if p.startswith(folder + "/")}
        picked, index_files = model_paths(inside)
        chosen |= {f"{folder}/{p}" for p in picked}
        indexes += [f"{folder}/{i}" for i in index_files]
    return chosen, tuple(indexes)


@dataclass(frozen=True)
class Followed:
    """What reading a selection's configs adds: ``paths``, ``absent``, ``foreign`` and ``unparsed`` as in
    :class:`CustomCode`, and ``needs_index``, the sharded indexes to follow next."""

    paths: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    needs_index: tuple[str, ...] = ()
    foreign: tuple[str, ...] = ()
    unparsed: tuple[str, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """One-line warnings for the report: code in other repos, files not parsed."""
        notes = [f"custom code in {repo}: warm it too" for repo in foreign_repos(self.foreign)]
        notes += [f"{path} is larger than {MAX_PARSE_BYTES} bytes: not parsed, the custom code it names or imports "
                  "is not fetched" for path in self.unparsed]
        return tuple(notes)


def follow_configs(needs_config: Sequence[str], read: Callable[[str], bytes | None], available: Iterable[str],
                   kind: str = "tokenizer", exclude: Sequence[str] = ()) -> Followed:
    """Finish a selection from the configs it needs (:func:`custom_code_paths`, :func:`module_folder_paths`, their
    arguments and RepoDataError)."""
    have = set(available)
    code = custom_code_paths([c for c in needs_config if c in AUTO_MAP_FILES], read, have, kind, exclude)
    modules: set[str] = set()
    indexes: tuple[str, ...] = ()
    unparsed = code.unparsed
    if MODULES_FILE in needs_config and MODULES_FILE in have:
        if (data := read(MODULES_FILE)) is None:
            unparsed += (MODULES_FILE,)
        else:
            modules, indexes = module_folder_paths(data, have)
    keep = {p for p in modules | set(code.paths) if not (exclude and matches(p, exclude))}
    return Followed(paths=tuple(sorted(keep)), absent=code.absent,
                    needs_index=tuple(i for i in indexes if i in keep), foreign=code.foreign, unparsed=unparsed)


def finish_selection(selection: Selection, read: Callable[[str], bytes | None], available: Iterable[str],
                     request: WarmRequest) -> tuple[set[str], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``(paths, absent, needs_index, notes)``: ``selection`` finished from its configs (:func:`follow_configs`), as
    warm and lock do. Raises IntegrityError naming the repo: a config no parser can read (transformers' neither)."""
    paths, absent, needs_index = set(selection.paths), selection.absent, selection.needs_index
    if not selection.needs_config:
        return paths, absent, needs_index, ()
    try:
        followed = follow_configs(selection.needs_config, read, available, request.kind, request.exclude)
    except ValueError as exc:  # RepoDataError
        raise IntegrityError(f"{request.repo_id}: {exc}", hint=BAD_FILE_HINT) from None
    return (paths | set(followed.paths), tuple(sorted(set(absent) | set(followed.absent))),
            needs_index + followed.needs_index, followed.notes)


#: The hint of a repo file hfcache cannot parse (:class:`RepoDataError`, a malformed sharded index).
BAD_FILE_HINT = "the repo's file is malformed (a loader fails on it too): fix the repo, or --exclude that file"


class RepoDataError(ValueError):
    """A repo file hfcache must parse (a config, ``modules.json``, a sharded index) that no parser can read; the
    message names the file, callers add the repo id."""

