"""check: prove that each tokenizer of a cache loads offline, as the application will load it.

A child process (``python -m hfcache.offline.probe``) runs with ``HF_HUB_OFFLINE=1``, ``HF_HUB_CACHE`` set to the cache,
``HF_ENDPOINT`` on a closed loopback port and an audit hook that fails any connection attempt at once. It calls
``AutoTokenizer.from_pretrained(<id>, revision=...)`` for every tokenizer and encodes a probe text. When a load fails,
the parent looks at the cache and names the missing piece (DESIGN §3): no ``config.json`` and no ``.no_exist``
marker, a missing Python package, a chat template the repo has but the cache lacks, a missing ref, custom code.

Custom code: a repo whose cached ``tokenizer_config.json`` / ``config.json`` ``auto_map`` names code a tokenizer load
runs (``selection.auto_map_refs``) is loaded with ``trust_remote_code=True``, as its application must load it; every
other repo without it. transformers copies that code into ``HF_MODULES_CACHE`` before importing it: an explicit
``HF_MODULES_CACHE`` in check's environment is passed on as the application gets it (an unwritable one fails the load
and is named as the cause); otherwise the child gets a private temporary one, so a read-only cache or HOME does not
fail the check (``hfcache exec`` handles the runtime side, see :mod:`hfcache.warming.modules_cache`). A repo whose configs no
parser can read (JSON nested too deeply) fails on its own, without stopping the others.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from ..cache import safefs
from ..cache.layout import RepoFolder
from ..errors import CacheError, CheckFailed, HfcacheError, InternalError, UsageError
from ..warming.lockfile import Lockfile
from ..warming.modules_cache import ENV_NAME, can_create
from ..records import parse_specs
from ..cache.scan import RepoInfo, load_hazards, scan_cache, scan_repo
from ..warming.selection import (AUTO_MAP_FILES, MAX_PARSE_BYTES, auto_map_refs, custom_code_paths, foreign_repos,
                                 module_path, tokenizer_paths)

DEFAULT_TEXT = "Hello world, 深度学习技术正在改变世界"
_PACKAGE_HINTS = (("sentencepiece", "sentencepiece"), ("protobuf", "protobuf"), ("tiktoken", "tiktoken"),
                  ("mistral_common", "mistral-common"), ("mistral-common", "mistral-common"))


@dataclass(frozen=True)
class CheckTarget:
    """A tokenizer to load: ``repo_id`` as the application passes it, at ``revision`` (a ref, or a 40-hex commit for
    a revision warmed by commit, which has no ref); ``chat_templates`` the template files the repo has (from a lock),
    to spot ones missing from the cache; ``trust_remote_code`` whether ``auto_map`` makes the load run custom code
    (set by :func:`check_tokenizers` from the cached configs)."""

    repo_id: str
    revision: str = "main"
    repo_type: str = "model"
    chat_templates: tuple[str, ...] = ()
    trust_remote_code: bool = False

    @property
    def spec(self) -> str:
        return f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class CheckResult:
    """One tokenizer's load.

    Attributes:
        target: what was loaded.
        ok (bool): it loaded and encoded the text.
        tokenizer_class (str | None), vocab_size (int | None), input_ids (list[int] | None): on success.
        seconds (float): load time in the child.
        error (str | None): the exception the load raised.
        cause (str | None): hfcache's diagnosis of what is missing, when it can tell.
    """

    target: CheckTarget
    ok: bool
    tokenizer_class: str | None = None
    vocab_size: int | None = None
    input_ids: tuple[int, ...] | None = None
    seconds: float = 0.0
    error: str | None = None
    cause: str | None = None


@dataclass(frozen=True)
class CheckReport:
    cache_dir: str
    text: str
    results: tuple[CheckResult, ...]
    import_seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else CheckFailed.exit_code


def targets_from_lock(lock: Lockfile) -> list[CheckTarget]:
    """Every locked repo whose selection holds tokenizer files, by the id and revision the manifest uses."""
    targets = []
    for repo in lock.repos:
        paths = [f.path for f in repo.files]
        if tokenizer_paths(paths) - {"config.json"}:
            templates = tuple(p for p in paths if p.startswith("additional_chat_templates/")
                              or p in ("chat_template.jinja", "chat_template.json"))
            targets.append(CheckTarget(repo.request.repo_id, repo.request.revision, repo.request.repo_type,
                                       templates))
    return targets


def cached_revisions(repo: RepoInfo) -> list[tuple[str, str]]:
    """``(revision, commit)`` of every snapshot of a repo: one per ref, and the commit itself for a snapshot no ref
    points to (``warm REPO_ID@<commit>`` writes no ref: the application loads it by commit)."""
    found = [(ref, commit.strip()) for ref, commit in sorted(repo.refs.items())]
    referenced = {commit for _, commit in found}
    found += [(r.commit_hash, r.commit_hash) for r in repo.revisions if r.commit_hash not in referenced]
    return found


def _has_tokenizer(repo: RepoInfo, commit: str) -> bool:
    revision = next((r for r in repo.revisions if r.commit_hash == commit), None)
    return revision is not None and bool(tokenizer_paths(f.path for f in revision.files) - {"config.json"})


def select_targets(targets: list[CheckTarget], specs: Iterable[str]) -> list[CheckTarget]:
    """The targets (e.g. a lock's) that ``REPO_ID[@REVISION]`` specs name; all of them when there is no spec.

    Raises:
        UsageError: a malformed spec, or one naming no target.
    """
    wanted = parse_specs(specs)
    if not wanted:
        return targets
    chosen = [t for t in targets if t.repo_id in wanted and (not wanted[t.repo_id] or t.revision in wanted[t.repo_id])]
    for repo_id, revisions in wanted.items():
        for revision in revisions or {None}:
            if not any(t.repo_id == repo_id and revision in (None, t.revision) for t in chosen):
                raise UsageError(f"{repo_id}{'@' + revision if revision else ''}: no such tokenizer in the lock",
                                 hint="name a repo_id (and revision) of the lock")
    return chosen


def targets_from_cache(cache_dir: Path, specs: Iterable[str] = ()) -> list[CheckTarget]:
    """The tokenizers of a cache to check: every model repo revision (by ref, or by commit when no ref points to it)
    whose snapshot holds tokenizer files; with ``specs`` (``REPO_ID[@REVISION]``), only those repos, at the
    revisions given (all cached ones when none is given).

    A spec naming something the cache lacks still becomes a target, so that its failed load says what is missing.

    Raises:
        UsageError: a malformed spec.
    """
    wanted = parse_specs(specs)
    targets: list[CheckTarget] = []
    found: set[str] = set()
    for repo in scan_cache(cache_dir, set(wanted) or None).repos:
        if repo.repo_type != "model":
            continue
        if repo.unsafe:
            targets.append(CheckTarget(repo.repo_id, "main"))  # reported as unsafe, never loaded
            found.add(repo.repo_id)
            continue
        asked = wanted.get(repo.repo_id)
        if asked:  # exactly the revisions named, loadable or not
            targets += [CheckTarget(repo.repo_id, revision) for revision in sorted(asked)]
            found.add(repo.repo_id)
            continue
        for revision, commit in cached_revisions(repo):
            # A repo this user cannot fully read is checked anyway: what it holds is unknown, the load tells.
            if repo.unreadable or _has_tokenizer(repo, commit):
                targets.append(CheckTarget(repo.repo_id, revision))
                found.add(repo.repo_id)
        if repo.unreadable and repo.repo_id not in found:
            targets.append(CheckTarget(repo.repo_id, "main"))
            found.add(repo.repo_id)
    for repo_id, asked in sorted(wanted.items()):
        if repo_id not in found:
            targets += [CheckTarget(repo_id, revision) for revision in sorted(asked or {"main"})]
    return targets


def snapshot_of(cache_dir: Path, target: CheckTarget) -> Path | None:
    """The cached snapshot folder a target loads from (its ref's commit, or the revision itself when it is a
    commit), or None when the cache cannot resolve it."""
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    try:
        ref = folder.read_ref(target.revision)  # O_NOFOLLOW: a planted ref link is never read through
        commit = ref.decode().strip() if ref is not None else target.revision
    except (OSError, UnicodeDecodeError, CacheError):
        return None
    snapshot = folder.root / "snapshots" / commit
    try:
        safefs.check_existing(cache_dir, (folder.name, "snapshots", commit))  # never through a planted link
    except (OSError, CacheError):
        return None
    # os.path.isdir, not Path.is_dir: Python 3.11's raises PermissionError on an unreadable snapshots/
    return snapshot if re.fullmatch(r"[0-9a-f]{40}", commit) and os.path.isdir(snapshot) else None


#: The parts of a repo folder an offline load by repo id reads: huggingface_hub resolves the revision in ``refs/``,
#: opens files through ``snapshots/<commit>/`` into ``blobs/``, and looks for absent files in ``.no_exist/<commit>/``.
LOAD_PARTS = ("refs", "snapshots", "blobs", ".no_exist")


def unreadable_parts(cache_dir: Path, target: CheckTarget) -> tuple[str, ...]:
    """The parts of ``target``'s repo folder that an offline load needs and this user cannot list or enter
    (:data:`LOAD_PARTS` and every folder below them), relative to the cache (``models--org--name/refs/``); empty when
    all can be read or the repo is not cached. A load by commit can succeed where the application's load by repo id
    fails (an unreadable ``refs/``): such a repo fails the check whatever the probe would say."""
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type).root
    if not os.path.lexists(folder):
        return ()
    denied = list(scan_repo(folder, target.repo_id, target.repo_type).unreadable)
    if "" not in denied:
        denied += _unreadable_below(folder, ".no_exist")
    return tuple(f"{folder.name}/{part}" for part in sorted(set(denied)))


def _unreadable_below(folder: Path, part: str) -> list[str]:
    """Folders under ``folder/part`` this user cannot list or enter, relative to ``folder`` (``.no_exist/abc/``)."""
    top = folder / part
    if not os.path.lexists(top):
        return []
    denied: list[str] = []
    for root, dirs, _ in os.walk(top, onerror=lambda exc: denied.append(
            os.path.relpath(exc.filename, folder) + "/" if exc.filename else part + "/")):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path) and not os.access(path, os.R_OK | os.X_OK):
                denied.append(os.path.relpath(path, folder) + "/")
    return denied


def _blocked(cache_dir: Path, targets: list[CheckTarget], unsafe: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    """spec -> :func:`unreadable_parts` of each target (safe layout) whose repo has parts this user cannot read; one
    look per repo folder, not per revision."""
    denied: dict[tuple[str, str], tuple[str, ...]] = {}
    for t in targets:
        if not unsafe[t.spec] and (t.repo_id, t.repo_type) not in denied:
            denied[(t.repo_id, t.repo_type)] = unreadable_parts(cache_dir, t)
    return {t.spec: denied[(t.repo_id, t.repo_type)] for t in targets
            if not unsafe[t.spec] and denied[(t.repo_id, t.repo_type)]}


def _unreadable_result(target: CheckTarget, parts: tuple[str, ...]) -> CheckResult:
    shown = ", ".join(parts[:4]) + (f" (and {len(parts) - 4} more)" if len(parts) > 4 else "")
    return CheckResult(target, False, error="PermissionError: part of the repo cannot be read",
                       cause=f"{shown} cannot be read by this user (permission denied): the application's offline "
                             f"load of {target.repo_id} needs {'it' if len(parts) == 1 else 'them'}; ask the "
                             "cache's owner to make it group-readable (`hfcache doctor` prints the fix)")


def custom_code_refs(cache_dir: Path, target: CheckTarget) -> tuple[str, ...]:
    """The ``auto_map`` class references a tokenizer load of ``target`` runs, read from its cached configs (the same
    rule as warm's selection: ``selection.auto_map_refs``); empty when it runs none or the cache cannot tell.

    Raises:
        selection.RepoDataError: a cached config is nested too deeply to parse (the load fails on it too)."""
    snapshot = snapshot_of(cache_dir, target)
    refs: list[str] = []
    for name in AUTO_MAP_FILES if snapshot is not None else ():
        try:
            data = safefs.read_snapshot_file(snapshot, name, MAX_PARSE_BYTES)  # regular files only, no FIFO hang
        except (OSError, CacheError):
            continue
        if data is None:
            continue
        refs += [r for r in auto_map_refs(name, data) if r not in refs]
    return tuple(refs)


def _closed_endpoint() -> str:
    """A loopback URL nothing listens on: a stray request is refused at once instead of reaching a real Hub."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def probe_environment(cache_dir: Path) -> dict[str, str]:
    """The child's environment: the caller's, minus every HF_/TRANSFORMERS_ setting, plus offline mode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_CACHE=str(cache_dir),
        HF_HOME=str(cache_dir / ".hfcache-check-home"),
        HF_ENDPOINT=_closed_endpoint(),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1",
        HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
    )
    return env


def check_tokenizers(cache_dir: Path, targets: list[CheckTarget], text: str = DEFAULT_TEXT,
                     timeout: float = 600) -> CheckReport:
    """Load every target in one offline child process and diagnose the failures.

    Targets whose cached configs name custom code (:func:`custom_code_refs`) are loaded with
    ``trust_remote_code=True``; the child's ``HF_MODULES_CACHE`` is the caller's explicit one (as the application gets
    it), else a temporary folder, removed afterwards. A target whose configs cannot be parsed is a failed result. A
    target whose repo has a part the load needs that this user cannot read (:func:`unreadable_parts`) is not loaded:
    it fails with that part as its cause, and the other targets are still loaded.

    Raises:
        InternalError: the child crashed or printed no result.
    """
    # A repo folder with a planted link is not loaded: transformers would read whatever the link points to.
    # So is a revision with a FIFO, device or a link leaving the repo (scan.load_hazards): the load would block.
    unsafe = {t.spec: _hazards(cache_dir, t) for t in targets}
    blocked = _blocked(cache_dir, targets, unsafe)
    # A repo the cache does not hold at all fails without a load: transformers would only say it could not reach
    # the closed endpoint the child is given (a port the user never set).
    absent = {t.spec for t in targets if t.spec not in blocked
              and not os.path.lexists(RepoFolder(cache_dir, t.repo_id, t.repo_type).root)}
    unparsable: dict[str, str] = {}  # a cached config no parser can read (selection.RepoDataError): that repo fails
    prepared = []
    for target in targets:
        try:
            trust = not unsafe[target.spec] and target.spec not in blocked and bool(custom_code_refs(cache_dir, target))
            prepared.append(replace(target, trust_remote_code=trust))
        except ValueError as exc:
            unparsable[target.spec] = str(exc)
            prepared.append(target)
    targets = prepared
    loadable = [t for t in targets
                if not unsafe[t.spec] and t.spec not in blocked and t.spec not in unparsable and t.spec not in absent]
    raw = _probe(cache_dir, loadable, text, timeout) if loadable else {}
    results = []
    for target in targets:
        if unsafe[target.spec]:
            results.append(CheckResult(target, False, error="not loaded: unsafe cache layout",
                                       cause="; ".join(unsafe[target.spec])))
        elif target.spec in blocked:
            results.append(_unreadable_result(target, blocked[target.spec]))
        elif target.spec in absent:
            folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
            missing = f"{target.repo_id} is not in the cache (no {folder.name}/): hfcache warm {target.repo_id}"
            results.append(CheckResult(target, False, error=missing, cause=missing))
        elif target.spec in unparsable:
            reason = unparsable[target.spec]
            results.append(CheckResult(target, False, error=reason,
                                       cause=f"{target.repo_id}: {reason}: no loader can read it (fix the repo)"))
        else:
            results.append(_result(cache_dir, target, raw))
    return CheckReport(cache_dir=str(cache_dir), text=text, results=tuple(results),
                       import_seconds=raw.get("__import_seconds__", {}).get("seconds", 0.0))


def _probe(cache_dir: Path, targets: list[CheckTarget], text: str, timeout: float) -> dict:
    """Run the offline probe child on ``targets``; its JSON answer (spec -> result). The child's ``HF_MODULES_CACHE``
    is the caller's explicit one (as the application gets it), else a temporary folder removed afterwards."""
    env = probe_environment(cache_dir)
    home = Path(env["HF_HOME"])
    explicit = os.environ.get(ENV_NAME)
    modules = explicit if explicit is not None else tempfile.mkdtemp(prefix="hfcache-check-modules-")
    env[ENV_NAME] = modules
    args = [a for t in targets for a in (["--trust-remote-code", t.spec] if t.trust_remote_code else [])]
    try:
        proc = subprocess.run([sys.executable, "-m", "hfcache.offline.probe", text, *[t.spec for t in targets], *args],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        _remove_tree(home)
        if explicit is None:
            _remove_tree(Path(modules))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InternalError(f"the offline probe process failed (exit {proc.returncode}): {tail}")
    raw = json.loads(lines[-1])
    for data in raw.values():
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            # The child's HF_ENDPOINT is a closed port of ours: name what it stands for, not the port.
            data["error"] = data["error"].replace(f"'{env['HF_ENDPOINT']}'", "the Hub (hfcache check is offline)") \
                .replace(env["HF_ENDPOINT"], "the Hub (hfcache check is offline)")
    return raw


def _result(cache_dir: Path, target: CheckTarget, raw: dict) -> CheckResult:
    """One target's CheckResult from the probe's answer, with the diagnosis of a failure."""
    data = raw.get(target.spec, {"error": "no result"})
    if "error" in data:
        return CheckResult(target, False, seconds=data.get("seconds", 0.0), error=data["error"],
                           cause=diagnose(cache_dir, target, data["error"]))
    # transformers drops an uncached chat template silently (DESIGN §3): the load "works", the app breaks.
    lost = _missing_templates(cache_dir, target)
    return CheckResult(
        target, not lost, data["class"], data["vocab_size"], tuple(data["input_ids"]), data["seconds"],
        error="loaded without its chat template(s)" if lost else None,
        cause=f"chat template(s) in the repo but not in the cache: {', '.join(lost)}" if lost else None)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _missing_templates(cache_dir: Path, target: CheckTarget) -> list[str]:
    """The target's chat templates (known from a lock) that its cached snapshot lacks."""
    if not target.chat_templates:
        return []
    snapshot = snapshot_of(cache_dir, target)
    if snapshot is None:
        return list(target.chat_templates)
    return [t for t in target.chat_templates if not (snapshot / t).exists()]


def custom_code_cause(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    """Why a load that runs custom code (``auto_map``) failed, when the custom code is the cause; else None.

    Looks at, in order: a module of another repo, a module missing from the snapshot (marked absent or not), the
    load refusing to run code without ``trust_remote_code``, an unwritable ``HF_MODULES_CACHE`` (the explicit one of
    check's environment, which the child used), packages the code imports that are not installed (transformers
    ``dynamic_module_utils.check_imports`` message), an ``auto_map`` entry that is not ``module.Class``, and the code
    itself failing (a syntax error, a circular import, any exception while it is imported).
    """
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
    """A module ``auto_map`` names (or one it imports) that the snapshot lacks."""
    snapshot = snapshot_of(cache_dir, target)
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    for module in _missing_code(snapshot) if snapshot is not None else ():
        if folder.marker_path(snapshot.name, module).exists():
            return f"custom code: auto_map needs {module}, which the repo does not have"
        return (f"custom code: auto_map needs {module}, which is not in the cache (warm the repo again with this "
                "hfcache: it fetches the code auto_map names and the files it imports)")
    return None


def _environment_cause(error: str) -> str | None:
    """trust_remote_code not passed, an unwritable modules cache, a package the code imports not installed."""
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
    present = {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}

    def read(path: str) -> bytes | None:
        return safefs.read_snapshot_file(snapshot, path, MAX_PARSE_BYTES)

    try:
        return custom_code_paths(AUTO_MAP_FILES, read, present).absent
    except (OSError, ValueError, CacheError):
        return ()


def diagnose(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    """Name the missing piece behind a failed offline load, from the cache's contents and the error text."""
    try:
        return _diagnose(cache_dir, target, error)
    except PermissionError as exc:  # Python 3.11's Path.exists()/is_dir() raise on EACCES
        return (f"{exc.filename or cache_dir} cannot be read by this user (permission denied): ask the cache's "
                "owner to make it group-readable (`hfcache doctor` prints the fix)")


def _hazards(cache_dir: Path, target: CheckTarget) -> list[str]:
    """Why ``target`` must not be loaded (scan.load_hazards: planted links in its repo folder, a symlinked ref,
    snapshot or marker folder, a FIFO/device or an absolute/outside link in its snapshot); empty when it may be."""
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    problems = folder.layout_problems()
    if problems or not os.path.isdir(folder.root):
        return problems
    repo = scan_repo(folder.root, target.repo_id, target.repo_type)
    if repo.unsafe:
        return list(repo.unsafe)
    commit = target.revision if re.fullmatch(r"[0-9a-f]{40}", target.revision) else repo.refs.get(target.revision)
    return load_hazards(repo, commit) if commit else []


def _diagnose(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    cause = custom_code_cause(cache_dir, target, error)
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
        commit = target.revision if re.fullmatch(r"[0-9a-f]{40}", target.revision) else ""
        if not commit:
            return f"refs/{target.revision} is missing: the revision cannot be resolved offline"
    if commit != commit.strip():
        return f"refs/{target.revision} has trailing whitespace: offline resolution fails (hfcache verify --repair)"
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return f"refs/{target.revision} holds {commit[:50]!r}, not a commit: offline resolution fails"
    snapshot = folder.root / "snapshots" / commit
    if not snapshot.is_dir():
        if commit == target.revision:
            return f"no snapshot of commit {commit[:12]} in the cache"
        return f"refs/{target.revision} points to {commit[:12]}, which has no snapshot"
    if not (snapshot / "config.json").exists() and not folder.marker_path(commit, "config.json").exists():
        return ("no config.json and no .no_exist marker for it: transformers 5 needs one of them to load a "
                "tokenizer offline (hfcache warm writes the marker)")
    missing = _missing_templates(cache_dir, target)
    if missing:
        return f"chat template(s) in the repo but not in the cache: {', '.join(missing)}"
    broken = [p.name for p in snapshot.rglob("*") if p.is_symlink() and not p.exists()]
    if broken:
        return f"broken snapshot link(s): {', '.join(sorted(broken))} (hfcache verify --repair)"
    if "network access attempted" in error or "couldn't connect" in error.lower() or "offline" in error.lower():
        named = re.findall(r"[\w./-]+\.(?:py|json|txt|model|jinja)\b", error)
        file = next((n for n in named if "://" not in n and not n.startswith("http")), None)
        return (f"{file} is needed by the load but neither cached nor marked absent (.no_exist): warm the repo "
                "again" if file else "a file the load needs is neither cached nor marked absent (.no_exist)")
    return _code_failure_cause(error) if target.trust_remote_code else None
