"""``hfcache path``: the absolute snapshot folder of ``REPO_ID[@REVISION]`` in a cache, or the files in it matching a
glob, resolved offline (docs/runtimes.md), as huggingface_hub's ``try_to_load_from_cache`` finds them
(``file_download.py``) but with no huggingface_hub code, through descriptors following no link."""

from __future__ import annotations

import errno
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..cache import safefs
from ..cache.layout import RepoFolder
from ..cache.root import access_error, refuse_misplaced_cache
from ..cache.safefs_tree import walk
from ..errors import CacheError, CheckFailed, UsageError
from ..names import check_folder_name, is_commit, not_inert, repo_folder_name, url_prefix
from ..records import MAX_GLOB_CHARS, WarmRequest, validate_repo_path
from ..warming.selection import matches

#: The type prefix of ``hf://`` paths (``hf_file_system.py``; "datasets", "kernels" are reserved, never orgs).
_TYPE_PREFIXES = {url_prefix(t): t for t in ("dataset", "kernel")}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = frozenset("*?[")
_SHOWN = 5  #: most names listed in one error


class PathNotCached(CheckFailed):
    """What ``hfcache path`` was asked for is not in the cache (exit 1). ``missing``: ``cache``, ``repo``, ``ref``,
    ``snapshot``, ``file`` (none matches) or ``blob`` (a dangling link); ``warm_command``: the ``hfcache warm ...``
    line that fetches it (also the hint), None when warming cannot help (the repo marks the file absent)."""

    def __init__(self, message: str, *, missing: str, warm_command: str | None) -> None:
        hint = f"fetch it: {warm_command}" if warm_command else "pick a file the repo has (hfcache ls --revisions)"
        super().__init__(message, hint=hint)
        self.missing = missing
        self.warm_command = warm_command


class AmbiguousPath(CheckFailed):
    """More (or fewer) files match than the caller allows (``--one``): exit 1, naming how many and which."""


@dataclass(frozen=True)
class ResolvedPath:
    """A revision (as asked: a branch, tag or commit) of a cached repo, resolved: ``snapshot`` is the absolute
    ``<cache>/<folder>/snapshots/<commit>``, ``files`` its regular files matching ``pattern`` (none without one)."""

    repo_id: str
    revision: str
    commit_hash: str
    snapshot: Path
    files: tuple[Path, ...] = ()
    repo_type: str = "model"
    pattern: str | None = field(default=None, compare=False)

    def one(self) -> Path:
        """The absolute snapshot path of the single file matching :attr:`pattern`. Raises UsageError (no pattern),
        AmbiguousPath (exit 1, naming how many and the first few) when not exactly one matches."""
        if self.pattern is None:
            raise UsageError("exactly one file was asked for, but no PATTERN was given",
                             hint="add a PATTERN, e.g. '*Q8_0*.gguf' or tokenizer.json")
        if len(self.files) != 1:
            names = _some([str(p.relative_to(self.snapshot)) for p in self.files])
            raise AmbiguousPath(f"{len(self.files)} files match {self.pattern!r} in {_label(self)}, expected exactly "
                                f"one: {names}", hint="narrow the PATTERN (e.g. the full file name)")
        return self.files[0]


def parse_spec(spec: str, repo_type: str | None = None) -> WarmRequest:
    """``[datasets/|kernels/]REPO_ID[@REVISION]`` parsed with :meth:`WarmRequest.parse` (revision ``main`` by default);
    the prefix (as in ``hf://`` paths) sets the type, else ``repo_type``, else ``model``. Raises UsageError: a malformed
    id or revision, an unknown type, or a prefix contradicting ``repo_type``."""
    if not isinstance(spec, str) or not spec:
        raise UsageError(f"invalid repo spec {spec!r}", hint="use REPO_ID[@REVISION], e.g. bert-base-uncased@main")
    if (prefixed := next((t for p, t in _TYPE_PREFIXES.items() if spec.startswith(p)), None)) is not None:
        spec = spec.split("/", 1)[1]
        if repo_type is not None and repo_type != prefixed:
            raise UsageError(f"the spec names a {prefixed} repo but --repo-type is {repo_type}",
                             hint="drop the datasets/ or kernels/ prefix, or the --repo-type option")
    return WarmRequest.parse(spec, repo_type=repo_type or prefixed or "model")


def check_pattern(pattern: str) -> str:
    """``pattern`` when non-empty, at most ``MAX_GLOB_CHARS`` (fnmatch costs grow with its square), with no control
    character; else UsageError (exit 2)."""
    if not isinstance(pattern, str) or not pattern:
        raise UsageError("empty PATTERN", hint="give a glob such as '*.safetensors', or leave PATTERN out")
    if len(pattern) > MAX_GLOB_CHARS:
        raise UsageError(f"PATTERN is {len(pattern)} characters long (the limit is {MAX_GLOB_CHARS})",
                         hint="match with a shorter glob (e.g. '*Q8_0*.gguf')")
    if not_inert(pattern) is not None:
        raise UsageError(f"PATTERN {pattern!r} holds a control or invisible character",
                         hint="repo file names are printable: quote the glob in single quotes")
    return pattern


def parse_path_var(text: str) -> tuple[str, str, str | None]:
    """``NAME=REPO_ID[@REVISION][:PATTERN]`` (``exec --path``) as (NAME, spec, pattern or None): neither refs nor ids
    hold ``:``, so the first one after ``=`` starts the pattern. Raises UsageError: NAME is no variable name, a
    malformed spec (:func:`parse_spec`), an empty or refused pattern (:func:`check_pattern`)."""
    grammar = "NAME=REPO_ID[@REVISION][:PATTERN]"
    if not isinstance(text, str) or "=" not in text:
        raise UsageError(f"invalid --path {text!r:.200}: expected {grammar}", hint="e.g. MODEL=org/name@main")
    name, _, rest = text.partition("=")
    if not _ENV_NAME.fullmatch(name):
        raise UsageError(f"invalid --path {text!r:.200}: {name!r:.60} is not a variable name",
                         hint="NAME is letters, digits and _, not starting with a digit: e.g. MODEL")
    spec, sep, pattern = rest.partition(":")
    if not spec:
        raise UsageError(f"invalid --path {text!r:.200}: no repo after '='", hint=f"use {grammar}")
    if sep and not pattern:
        raise UsageError(f"invalid --path {text!r:.200}: empty pattern after ':'",
                         hint="give a glob after ':' (e.g. MODEL=org/name:'*.gguf'), or drop the ':'")
    parse_spec(spec)
    if sep:
        check_pattern(pattern)
    return name, spec, pattern if sep else None


def resolve(cache: Path, spec: str, pattern: str | None = None, *, repo_type: str | None = None) -> ResolvedPath:
    """Resolve ``spec`` (:func:`parse_spec`) in the cache root ``cache``, offline; ``pattern``: a glob over the
    snapshot's repo paths as huggingface_hub's ``allow_patterns`` (``utils/_paths.py``: ``*`` crosses ``/``, ``\\``
    is ``/``), None: the snapshot folder only. Raises UsageError (exit 2): a malformed spec or pattern, a cache path
    holding a control character; PathNotCached (exit 1, warm hint): no cache, repo, ref, snapshot or matching file,
    or a dangling link; UnsafeLayout (exit 5): a link leaving the repo folder, a FIFO, a device, a folder chain too
    deep; CacheError (exit 5): a part of the cache this user cannot read.
    """
    request = parse_spec(spec, repo_type)
    if pattern is not None:
        pattern = check_pattern(pattern)
    root = Path(cache).absolute()  # as resolve_cache_dir: the path as given, not resolved (the root may be a link)
    _check_shown(str(root), "the cache path")
    refuse_misplaced_cache(root, empty_ok=False)  # an HF_HOME: its hub/ named, never a warm into the HF_HOME
    folder = repo_folder_name(request.repo_id, request.repo_type)
    check_folder_name(folder)
    try:
        commit = _commit_of(root, folder, request, pattern)
        snapshot = root / folder / "snapshots" / commit
        entries = _snapshot_entries(root, folder, commit)
        chosen = [p for p in entries if matches(p, [pattern.replace("\\", "/")])] if pattern else entries
        if pattern and not chosen:
            raise _no_match(root, folder, request, commit, pattern, len(entries))
        _check_files(root, folder, request, commit, chosen, pattern)
    except PermissionError as exc:
        part = f" ({exc.filename})" if exc.filename else ""  # a name relative to a folder descriptor, if any
        raise CacheError(f"{root / folder}{part}: permission denied for uid {os.geteuid()}",
                         hint="ask the cache's owner to make it group-readable (`hfcache doctor` prints the fix)"
                         ) from None
    files = tuple(snapshot / p for p in chosen) if pattern else ()
    return ResolvedPath(repo_id=request.repo_id, revision=request.revision, commit_hash=commit, snapshot=snapshot,
                        files=files, repo_type=request.repo_type, pattern=pattern)


def warm_command(cache: Path, request: WarmRequest, pattern: str | None = None) -> str:
    """The shell-quoted ``hfcache warm`` line that fetches ``request`` into ``cache``: the whole repo (``--kind model``,
    ``all`` for a dataset or kernel), or with a pattern the tokenizer set plus ``--include`` (``--kind all`` for a
    dataset or kernel)."""
    words = ["hfcache", "warm", request.spec, "--cache-dir", str(cache)]
    if request.repo_type != "model":
        words += ["--repo-type", request.repo_type]
    if pattern is not None:
        words += ["--include", pattern] if request.repo_type == "model" else ["--kind", "all", "--include", pattern]
    else:
        words += ["--kind", "model" if request.repo_type == "model" else "all"]
    return " ".join(shlex.quote(w) for w in words)


def _label(what: WarmRequest | ResolvedPath) -> str:
    return f"{url_prefix(what.repo_type)}{what.repo_id}@{what.revision}"


def _some(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def _check_shown(text: str, what: str) -> None:
    """Refuse a path that would not print as one inert line (exit 2 for the cache path; exit 5 below it)."""
    if (char := not_inert(text)) is None:
        return
    escaped = text.encode("unicode_escape", "backslashreplace").decode("ascii")[:200]
    if what == "the cache path":
        raise UsageError(f"the cache path {escaped} holds a control or invisible character (U+{ord(char):04X}): "
                         "it cannot be printed as one line", hint="use a --cache-dir made of printable characters")
    raise safefs.UnsafeLayout(f"{what} {escaped} holds a control or invisible character (U+{ord(char):04X}): left "
                              "alone (it cannot be printed as one line)", hint="remove it, then rerun")


def _commit_of(root: Path, folder: str, request: WarmRequest, pattern: str | None) -> str:
    """The commit ``request.revision`` names in the repo folder, whose snapshot folder exists."""
    hint = warm_command(root, request, pattern)
    try:
        is_dir = stat.S_ISDIR(os.stat(root).st_mode)
    except FileNotFoundError:
        is_dir = False
    except PermissionError:
        raise access_error(root) from None
    if not is_dir:
        raise PathNotCached(f"no cache at {root}", missing="cache", warm_command=hint)
    if not os.access(root, os.R_OK | os.X_OK):
        raise access_error(root)
    try:
        os.close(safefs.open_dir(root, (folder,)))
    except FileNotFoundError:
        raise PathNotCached(f"{_label(request)} is not in the cache {root}: no folder {folder}",
                            missing="repo", warm_command=hint) from None
    if is_commit(request.revision):
        commit = request.revision
        gone = f"commit {commit} of {request.repo_id} is not in the cache {root}"
    else:
        if (raw := RepoFolder(root, request.repo_id, request.repo_type).read_ref(request.revision)) is None:
            raise PathNotCached(f"{request.repo_id} has no ref {request.revision!r} in the cache {root} (no "
                                f"{folder}/refs/{request.revision}; {_cached_refs(root, folder)})",
                                missing="ref", warm_command=hint)
        text = raw.decode("ascii", "replace")
        if not is_commit(text):
            raise PathNotCached(f"{folder}/refs/{request.revision} is malformed ({text[:60]!r}, expected exactly 40 "
                                "hex characters): loaders cannot resolve it", missing="ref", warm_command=hint)
        commit = text
        gone = f"refs/{request.revision} of {request.repo_id} names commit {commit}, whose snapshot is missing"
    try:
        os.close(safefs.open_dir(root, (folder, "snapshots", commit)))
    except FileNotFoundError:
        raise PathNotCached(f"{gone} (no {folder}/snapshots/{commit})", missing="snapshot",
                            warm_command=hint) from None
    return commit


def _cached_refs(root: Path, folder: str) -> str:
    """``cached refs: a, b`` (five names at most, no link followed), or ``no refs cached``."""
    names: list[str] = []
    try:
        for found in walk(root, (folder, "refs"), max_depth=8):
            names += ["/".join((*found.parts[2:], n)) for n, st in found.entries if stat.S_ISREG(st.st_mode)]
            if len(names) > _SHOWN:
                break
    except (OSError, ValueError, CacheError):  # no refs folder, unreadable, a planted link or chain: nothing listed
        pass
    shown = [n for n in sorted(names)[:_SHOWN] if not_inert(n) is None]
    return f"cached refs: {', '.join(shown)}{', ...' if len(names) > _SHOWN else ''}" if shown else "no refs cached"


def _snapshot_entries(root: Path, folder: str, commit: str) -> list[str]:
    """Repo paths (sorted) of every non-folder entry of ``snapshots/<commit>``, walked without following links."""
    top = (folder, "snapshots", commit)
    found = []
    for here in walk(root, top):
        below = here.parts[len(top):]
        found += ["/".join((*below, name)) for name, st in here.entries if not stat.S_ISDIR(st.st_mode)]
    return sorted(found)


def _check_files(root: Path, folder: str, request: WarmRequest, commit: str, paths: list[str],
                 pattern: str | None) -> None:
    """Open each snapshot entry as a loader would: a regular file inside the repo folder; dangling links collected."""
    dangling = []
    for rel in paths:
        shown = f"{root}/{folder}/snapshots/{commit}/{rel}"
        _check_shown(rel, f"{root}/{folder}/snapshots/{commit}: the file name")
        try:
            fd = safefs.open_repo_file(root, folder, (commit, *rel.split("/")))
        except FileNotFoundError:
            dangling.append(rel)
            continue
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                raise safefs.UnsafeLayout(f"{shown}: a link where a file belongs: left alone",
                                          hint="remove it, then rerun") from None
            if exc.errno == errno.EINVAL:  # readlink of an entry swapped for a file after it was judged a link
                raise safefs.UnsafeLayout(f"{shown} changed while it was read: left alone",
                                          hint="rerun; if it persists, run `hfcache verify`") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise safefs.UnsafeLayout(f"{shown} is not a regular file (a FIFO, device or folder): left alone",
                                          hint="remove it, then rerun")
        finally:
            os.close(fd)
    if dangling:
        names = _some(dangling)
        what = f"{len(dangling)} of the files matching {pattern!r}" if pattern else f"{len(dangling)} files"
        raise PathNotCached(f"{_label(request)} (commit {commit[:12]}): {what} are dangling links, their blobs "
                            f"missing from the cache: {names}", missing="blob",
                            warm_command=warm_command(root, request, pattern))


def _no_match(root: Path, folder: str, request: WarmRequest, commit: str, pattern: str, count: int) -> PathNotCached:
    """No entry matches ``pattern``: a file the repo marks absent (``.no_exist``) is named as such."""
    if not _GLOB_CHARS.intersection(pattern) and _marked_absent(root, folder, commit, pattern):
        return PathNotCached(f"{_label(request)} has no file {pattern!r}: the repo lacks it at commit "
                             f"{commit[:12]} (marked absent in {folder}/.no_exist)", missing="file",
                             warm_command=None)
    return PathNotCached(f"no file matching {pattern!r} in {_label(request)} (commit {commit[:12]}; {count} files "
                         "cached)", missing="file", warm_command=warm_command(root, request, pattern))


def _marked_absent(root: Path, folder: str, commit: str, path: str) -> bool:
    """Whether ``.no_exist/<commit>/<path>`` is a regular file (no link followed); False for a bad path."""
    try:
        parts = validate_repo_path(path).split("/")
        with safefs.dir_fd(root, (folder, ".no_exist", commit, *parts[:-1])) as fd:
            return stat.S_ISREG(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode)
    except (OSError, ValueError, CacheError):  # missing, unreadable, a planted link (UnsafeLayout), a bad path
        return False
