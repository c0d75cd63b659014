"""diagnosis: name the missing piece behind a failed offline tokenizer load, from the cache and the error text
(for ``check`` and ``hfcache.offline.api.load_tokenizer``; what transformers needs offline: docs/cache-layout.md,
'Traps the libraries leave').
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..cache import safefs
from ..cache.fsops import scan_tree
from ..cache.layout import RepoFolder
from ..errors import CacheError, HfcacheError
from ..names import is_commit
from ..warming.custom_code import MAX_PARSE_BYTES, custom_code_paths, foreign_repos, module_path
from ..warming.modules_cache import ENV_NAME, can_create
from ..warming.selection import AUTO_MAP_FILES
from .check_child import ALL_TOKENIZERS, CRASHED, OWN_BUDGET
from .check_targets import CheckTarget, custom_code_refs, snapshot_of

_PACKAGE_HINTS = (("sentencepiece", "sentencepiece"), ("protobuf", "protobuf"), ("tiktoken", "tiktoken"),
                  ("mistral_common", "mistral-common"), ("mistral-common", "mistral-common"))


def missing_templates(cache_dir: Path, target: CheckTarget) -> list[str]:
    """The target's chat templates (known from a lock) that its cached snapshot lacks."""
    if not target.chat_templates:
        return []
    snapshot = snapshot_of(cache_dir, target)
    if snapshot is None:
        return list(target.chat_templates)
    return [t for t in target.chat_templates if not (snapshot / t).exists()]


def custom_code_cause(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    """Why a load that runs custom code (``auto_map``) failed, when that code is the cause, else None: a module of
    another repo or missing from the snapshot, the environment (:func:`_environment_cause`), an ``auto_map`` entry
    that is not ``module.Class``, the code failing (:func:`_code_failure_cause`)."""
    try:
        refs = custom_code_refs(cache_dir, target)
    except ValueError:
        return None
    if not refs:
        if "trust_remote_code=True" in error:  # code named where hfcache does not look (a newer transformers)
            return "custom code: the load needs trust_remote_code=True (the repo's auto_map names code)"
        return None
    foreign = foreign_repos(refs)
    if foreign and any(repo in error for repo in foreign):
        return f"custom code: auto_map names code in another repo ({', '.join(foreign)}): warm that repo too"
    cause = _missing_code_cause(cache_dir, target) or _environment_cause(error)
    if cause is not None:
        return cause
    bad = [r for r in refs if "--" not in r and module_path(r) is None]
    if bad:
        return f"custom code: auto_map entry {bad[0]!r} is not a module.Class reference transformers can load"
    return _code_failure_cause(error, generic=False)


def _missing_code_cause(cache_dir: Path, target: CheckTarget) -> str | None:
    snapshot = snapshot_of(cache_dir, target)
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    for module in _missing_code(snapshot) if snapshot is not None else ():
        if folder.marker_path(snapshot.name, module).exists():
            return f"custom code: auto_map needs {module}, which the repo does not have"
        return (f"custom code: auto_map needs {module}, which is not in the cache (warm the repo again with this "
                "hfcache: it fetches the code auto_map names and the files it imports)")
    return None


def _environment_cause(error: str) -> str | None:
    """trust_remote_code not passed, an unwritable modules cache, a package the code imports not installed
    (transformers ``check_imports``' message)."""
    if "trust_remote_code" in error:
        return "custom code: auto_map needs trust_remote_code=True, and the load did not pass it"
    explicit = os.environ.get(ENV_NAME)
    if explicit is not None and not can_create(Path(os.path.expanduser(explicit))):
        return (f"custom code: HF_MODULES_CACHE={explicit} is not writable: transformers copies the code there "
                "before importing it; point it at a writable folder, or unset it (hfcache env/exec then choose one)")
    if ("PermissionError" in error or "Read-only file system" in error) and "modules" in error:
        return ("custom code: transformers cannot write its modules cache (HF_MODULES_CACHE, default "
                "$HF_HOME/modules): point HF_MODULES_CACHE at a writable folder (hfcache env/exec do)")
    match = re.search(r"requires the following packages that were not found in your environment: ([^.]+)", error)
    if match:
        return f"custom code imports package(s) that are not installed: {match.group(1)} (pip install {match.group(1)})"
    return None


def _code_failure_cause(error: str, generic: bool = True) -> str | None:
    """The repo's own code failing as it is imported (the error names the exception; transformers adds nothing):
    a syntax error, a circular import, and with ``generic`` any other exception (once nothing else explains it)."""
    first = error.splitlines()[0][:300] if error else ""
    if first.startswith(("SyntaxError", "IndentationError", "TabError")):
        return f"custom code: the repo's code does not compile: {first}"
    if "circular import" in error or "partially initialized module" in error:
        return f"custom code: the repo's code has a circular import: {first}"
    if "network access attempted" in error or "couldn't connect" in error.lower() or "does not appear" in error:
        return None  # a missing file: diagnose() names it
    if not generic:
        return None
    return f"custom code: the repo's code raised while it was imported or run: {first}"


def _missing_code(snapshot: Path) -> tuple[str, ...]:
    """The code files ``auto_map`` names (and those they import relatively) that the snapshot lacks."""
    present = {rel for rel, path, _ in _snapshot_entries(snapshot) if os.path.isfile(path)}

    def read(path: str) -> bytes | None:
        return safefs.read_snapshot_file(snapshot, path, MAX_PARSE_BYTES)

    try:
        return custom_code_paths(AUTO_MAP_FILES, read, present).absent
    except (OSError, ValueError, CacheError):
        return ()


def _snapshot_entries(snapshot: Path) -> list[tuple[str, str, bool]]:
    """(path relative to the snapshot, full path, is a symlink) of every entry below ``snapshot``, no link followed,
    in a bounded walk."""
    return [(rel + e.name, e.path, e.is_symlink()) for _path, rel, dirs, others in scan_tree(str(snapshot))
            for e in (*dirs, *others)]


def diagnose(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    """Name the missing piece behind a failed offline load, from the cache's contents and the error text (its
    first :data:`MAX_ERROR_CHARS` characters: the rest is the repo's text)."""
    try:
        return _diagnose(cache_dir, target, error[:MAX_ERROR_CHARS])
    except PermissionError as exc:  # Python 3.11's Path.exists()/is_dir() raise on EACCES
        return (f"{exc.filename or cache_dir} cannot be read by this user (permission denied): ask the cache's "
                "owner to make it group-readable (`hfcache doctor` prints the fix)")


#: The characters of a load's error that are read (and reported: :mod:`hfcache.offline.probe` cuts there too).
MAX_ERROR_CHARS = 2000


def crash_cause(error: str) -> str | None:
    """Why a load failed when the tokenizers library panicked (``PanicException: ...``: a ``BaseException`` the load
    raised) or the load killed check's child (:data:`.check_child.CRASHED`); else None."""
    if error.startswith("PanicException"):
        return ("the tokenizers library panicked on this repo's tokenizer files (a malformed or hostile "
                "tokenizer.json): it cannot be loaded")
    if error.startswith(CRASHED):
        return ("loading this repo killed the process (a native library or the repo's code aborted on its files): "
                "it cannot be loaded; the other repos were loaded in a new process")
    return stop_cause(error)


def stop_cause(error: str) -> str | None:
    """Why check stopped a load (:func:`.check_child.probe_specs`' ``not loaded: ...`` errors), else None."""
    if not error.startswith("not loaded: "):
        return None
    if "probe process did not start" in error:
        return "the probe process did not import transformers in time (an overloaded machine?): run check again"
    if OWN_BUDGET in error:
        return ("this tokenizer's load or encode ran past its own time budget (HFCACHE_CHECK_REPO_TIMEOUT): a "
                "tokenizer.json whose regex backtracks, or whose normalizer grows the text, makes each encode slow; "
                "the other repos were loaded in a new process")
    if ALL_TOKENIZERS in error:
        return ("check's time for all tokenizers ran out " + ("before this load began: not this repo's failure; "
                                                              if "before this load began" in error else
                                                              "while this one loaded: ")
                + "check this repo alone to see whether it is slow")
    if "FIFO" in error:
        return "a cache file was swapped for a FIFO while check ran: the load blocked on it"
    return None


def _diagnose(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    cause = custom_code_cause(cache_dir, target, error) or crash_cause(error)
    if cause is not None:
        return cause
    for needle, package in _PACKAGE_HINTS:
        if needle in error and ("install" in error or "No module" in error or "requires" in error):
            return f"missing Python package: {package} (pip install {package})"
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    unsafe = folder.layout_problems()
    if unsafe:
        return f"{folder.name}: unsafe cache layout, left alone: {'; '.join(unsafe)}"
    if not folder.root.is_dir():
        return f"{target.repo_id} is not in the cache (no {folder.name}/)"
    try:
        raw = folder.read_ref(target.revision)
    except (OSError, HfcacheError) as exc:
        return f"refs/{target.revision} cannot be read: {exc}"
    commit = raw.decode("utf-8", "replace") if raw is not None else ""
    if raw is None:
        commit = target.revision if is_commit(target.revision) else ""
        if not commit:
            return f"refs/{target.revision} is missing: the revision cannot be resolved offline"
    if commit != commit.strip():
        return f"refs/{target.revision} has trailing whitespace: offline resolution fails (hfcache verify --repair)"
    if not is_commit(commit):
        return f"refs/{target.revision} holds {commit[:50]!r}, not a commit: offline resolution fails"
    snapshot = folder.root / "snapshots" / commit
    if not snapshot.is_dir():
        if commit == target.revision:
            return f"no snapshot of commit {commit[:12]} in the cache"
        return f"refs/{target.revision} points to {commit[:12]}, which has no snapshot"
    if not (snapshot / "config.json").exists() and not folder.marker_path(commit, "config.json").exists():
        return ("no config.json and no .no_exist marker for it: transformers 5 needs one of them to load a "
                "tokenizer offline (hfcache warm writes the marker)")
    missing = missing_templates(cache_dir, target)
    if missing:
        return f"chat template(s) in the repo but not in the cache: {', '.join(missing)}"
    broken = [os.path.basename(path) for _, path, link in _snapshot_entries(snapshot)
              if link and not os.path.exists(path)]
    if broken:
        return f"broken snapshot link(s): {', '.join(sorted(broken))} (hfcache verify --repair)"
    if "network access attempted" in error or "couldn't connect" in error.lower() or "offline" in error.lower():
        # At most 255 characters a name: the error text is the repo's (a config key of megabytes made an unbounded
        # run quadratic: minutes in the parent, which no budget bounds).
        named = re.findall(r"[\w./-]{1,255}\.(?:py|json|txt|model|jinja)\b", error)
        file = next((n for n in named if "://" not in n and not n.startswith("http")), None)
        return (f"{file} is needed by the load but neither cached nor marked absent (.no_exist): warm the repo "
                "again" if file else "a file the load needs is neither cached nor marked absent (.no_exist)")
    return _code_failure_cause(error) if target.trust_remote_code else None
