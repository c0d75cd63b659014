"""check: prove that each tokenizer of a cache loads offline, as the application will load it.

A child process (``python -m hfcache.offline.probe``) runs with ``HF_HUB_OFFLINE=1``, ``HF_HUB_CACHE`` set to the cache,
``HF_ENDPOINT`` on a closed loopback port and an audit hook that fails any connection attempt at once. It calls
``AutoTokenizer.from_pretrained(<id>, revision=...)`` for every tokenizer and encodes a probe text. When a load fails,
the parent looks at the cache and names the missing piece (:mod:`.diagnosis`; what transformers needs offline:
docs/cache-layout.md, 'Traps the libraries leave'): no ``config.json`` and no ``.no_exist`` marker, a missing
Python package, a chat template the repo has but the cache lacks, a missing ref, custom code. Which tokenizers are
loaded, and what the cache holds for each: :mod:`.check_targets`.

Custom code: a repo whose cached ``tokenizer_config.json`` / ``config.json`` ``auto_map`` names code a tokenizer load
runs (``custom_code.auto_map_refs``) is loaded with ``trust_remote_code=True`` only when the user opted in for it
(:class:`.check_trust.TrustPolicy`: ``--trust-remote-code REPO_ID``, or a lock's repos); any other such repo is not
loaded and reported as :data:`.check_trust.NOT_RUN`; as root, code from folders another user can change is refused
(:func:`.check_trust.root_refusal`, exit 2). Every other repo loads without it. transformers copies that code into
``HF_MODULES_CACHE`` before importing it: an explicit
``HF_MODULES_CACHE`` in check's environment is passed on as the application gets it (an unwritable one fails the load
and is named as the cause); otherwise the child gets a private temporary one, so a read-only cache or HOME does not
fail the check (``hfcache exec`` handles the runtime side, see :mod:`hfcache.warming.modules_cache`). A repo whose
configs no parser can read (JSON nested too deeply) fails on its own, without stopping the others; so does one whose
``tokenizer.json`` makes the tokenizers library panic or abort (:mod:`.fast_inputs`, :func:`.check_child.probe_specs`).

Kernel repos (huggingface_hub repo type ``kernel``, ``kernels--ORG--NAME``) hold compute kernels, never a tokenizer:
they are listed as skipped, with the reason, and count as passed; nothing is loaded for them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..bounds import MAX_TREE_DEPTH, TooDeep, loads_json
from ..cache import safefs
from ..cache.layout import RepoFolder
from ..cache.safefs_tree import iter_tree
from ..cache.scan import load_hazards, scan_repo
from ..errors import CheckFailed, UsageError
from ..warming.modules_cache import ENV_NAME
from .check_child import probe_specs
from .check_targets import CheckTarget, custom_code_refs, unreadable_parts
from .check_trust import NOT_RUN, TrustPolicy, refuse_as_root, root_refusal
from .diagnosis import diagnose, missing_templates

DEFAULT_TEXT = "Hello world, 深度学习技术正在改变世界"


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
        skipped (str | None): why nothing was loaded: a target that has no tokenizer to load (a kernel repo), or
            one whose custom code the user did not opt in to (starts with :data:`~.check_trust.NOT_RUN`); such a
            result is ``ok``, but a report where nothing loaded and something was not run is not.
        not_run (bool): nothing was loaded because the load would run custom code the user did not opt in to.
        fast_path (str | None): the fast path's verdict on the built-in corpus (:mod:`.tokenizer_corpus`):
            ``"equal"``, ``"differs: <first differing line, both ids>"`` or ``"refused: <reason>"``; None when
            nothing was loaded.
        commit (str | None): the commit the fast path read (the record's key).
    """

    target: CheckTarget
    ok: bool
    tokenizer_class: str | None = None
    vocab_size: int | None = None
    input_ids: tuple[int, ...] | None = None
    seconds: float = 0.0
    error: str | None = None
    cause: str | None = None
    skipped: str | None = None
    not_run: bool = False
    fast_path: str | None = None
    commit: str | None = None


#: Why a kernel repo is skipped (check_targets lists kernel repos so that a named or locked one is not a failure).
KERNEL_SKIP = "a kernel repo has no tokenizer: nothing to load (verify checks its files)"


@dataclass(frozen=True)
class CheckReport:
    cache_dir: str
    text: str
    results: tuple[CheckResult, ...]
    import_seconds: float
    #: whether the fast-path verdicts were recorded (:mod:`.fast_record`); None when none was proved.
    fast_recorded: bool | None = None

    @property
    def ok(self) -> bool:
        """No load failed, and unless nothing needed a load, something was loaded: a check that ran nothing because
        every target needs custom code the user did not opt in to is not a pass."""
        if not all(r.ok for r in self.results):
            return False
        return not any(r.not_run for r in self.results) or any(r.ok and not r.skipped for r in self.results)

    @property
    def not_run(self) -> tuple[CheckResult, ...]:
        """The results not loaded because their custom code was not opted in to."""
        return tuple(r for r in self.results if r.not_run)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else CheckFailed.exit_code


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


def _closed_endpoint() -> str:
    """A loopback URL nothing listens on: a stray request is refused at once instead of reaching a real Hub."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def probe_environment(cache_dir: Path, home: Path | None = None) -> dict[str, str]:
    """The child's environment: the caller's, minus every HF_/TRANSFORMERS_ setting, plus offline mode.

    Args:
        cache_dir (Path): the cache (``HF_HUB_CACHE``).
        home (Path | None): the child's ``HF_HOME``: a private folder of the caller's, never one below the cache
            (a member of a shared cache could plant what the child reads there) [default: ``<tmp>/hfcache-check-home``
            of a fresh private temporary folder, which the caller removes].
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_CACHE=str(cache_dir),
        HF_HOME=str(home or Path(tempfile.mkdtemp(prefix="hfcache-check-")) / "home"),
        HF_ENDPOINT=_closed_endpoint(),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1",
        HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
    )
    return env


def check_tokenizers(cache_dir: Path, targets: list[CheckTarget], text: str = DEFAULT_TEXT,
                     timeout: float = 600, trust: TrustPolicy | None = None) -> CheckReport:
    """Load every target in an offline child process and diagnose the failures; a kernel repo's target is not
    loaded but skipped (:data:`KERNEL_SKIP`), in its place among the results. A target whose load raises, makes the
    tokenizers library panic, or kills the child fails alone; the others get their results.

    Args:
        cache_dir (Path): the cache; targets (list[CheckTarget]): what to load; text (str): the probe text.
        timeout (float): seconds the children may take in all; past it, the target being loaded and those not yet
            loaded fail.
        trust (TrustPolicy | None): the targets whose custom code (``auto_map``) may run [default: none]; any
            other target that needs it is not loaded (``not_run``).

    Returns:
        CheckReport: one result per target, in the targets' order.

    Raises:
        UsageError: running as root, a trusted target's code comes from a folder another user can change;
            transformers is not installed (:func:`require_transformers`).
        InternalError: the child ended before it loaded anything (:func:`.check_child.probe_specs`).
    """
    loaded = [t for t in targets if t.repo_type != "kernel"]
    if loaded:
        require_transformers()
    report = _load_tokenizers(cache_dir, loaded, text, timeout, trust or TrustPolicy()) if loaded else \
        CheckReport(cache_dir=str(cache_dir), text=text, results=(), import_seconds=0.0)
    results = iter(report.results)
    merged = tuple(CheckResult(t, True, skipped=KERNEL_SKIP) if t.repo_type == "kernel" else next(results)
                   for t in targets)
    return replace(report, results=merged, fast_recorded=_record_fast_path(cache_dir, merged))


def require_transformers() -> None:
    """Fail before any child starts when transformers is not installed (the extra ``check``: a core install has
    none), instead of one failed row per tokenizer. Found with ``importlib.util.find_spec``: importing it here would
    cost the parent ~0.8 s that the child pays anyway.

    Raises:
        UsageError: transformers is not installed (exit 2; the hint names ``pip install 'hfcache[check]'``).
    """
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise UsageError("hfcache check loads each tokenizer with transformers, which is not installed",
                         hint="pip install 'hfcache[check]'")


def _record_fast_path(cache_dir: Path, results: tuple[CheckResult, ...]) -> bool | None:
    """Record each proved verdict (``equal``/``differs``) by repo and commit (:mod:`.fast_record`); whether it was
    written (None: nothing to record)."""
    import tokenizers

    from . import fast_record

    verdicts = {fast_record.key(r.target.repo_type, r.target.repo_id, r.commit): r.fast_path for r in results
                if r.commit and r.fast_path and not r.fast_path.startswith("refused")}
    return fast_record.save(str(cache_dir), verdicts, tokenizers.__version__) if verdicts else None


def _load_tokenizers(cache_dir: Path, targets: list[CheckTarget], text: str, timeout: float,
                     trust: TrustPolicy) -> CheckReport:
    """Load every target in one offline child process and diagnose the failures.

    Targets whose cached configs name custom code (:func:`custom_code_refs`) are loaded with
    ``trust_remote_code=True`` when ``trust`` allows them, else not loaded (``not_run``); the child's
    ``HF_MODULES_CACHE`` is the caller's explicit one (as the application gets
    it), else a temporary folder, removed afterwards. A target whose configs cannot be parsed is a failed result. A
    target whose repo has a part the load needs that this user cannot read (:func:`unreadable_parts`) is not loaded:
    it fails with that part as its cause, and the other targets are still loaded.

    Raises:
        InternalError: the child ended before it loaded anything (:func:`.check_child.probe_specs`).
    """
    # A repo folder with a planted link is not loaded: transformers would read whatever the link points to.
    # So is a revision with a FIFO, device or a link leaving the repo (scan.load_hazards): the load would block.
    unsafe = {t.spec: _hazards(cache_dir, t) for t in targets}
    blocked = _blocked(cache_dir, targets, unsafe)
    # A repo the cache does not hold at all fails without a load: transformers would only say it could not reach
    # the closed endpoint the child is given (a port the user never set).
    absent = {t.spec for t in targets if t.spec not in blocked
              and not os.path.lexists(RepoFolder(cache_dir, t.repo_id, t.repo_type).root)}
    targets, unparsable, not_run = _prepare(cache_dir, targets, {s for s in unsafe if unsafe[s]} | set(blocked), trust)
    loadable = [t for t in targets if not unsafe[t.spec] and t.spec not in blocked and t.spec not in unparsable
                and t.spec not in absent and t.spec not in not_run]
    raw = _probe(cache_dir, loadable, text, timeout) if loadable else {}
    results = []
    for target in targets:
        if target.spec in not_run:
            results.append(CheckResult(target, True, skipped=not_run[target.spec], not_run=True))
        elif unsafe[target.spec]:
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


def _prepare(cache_dir: Path, targets: list[CheckTarget], unloadable: set[str],
             trust: TrustPolicy) -> tuple[list[CheckTarget], dict[str, str], dict[str, str]]:
    """Which targets run custom code: (the targets with ``trust_remote_code`` set where ``trust`` allows the code
    their configs name, spec -> why its configs cannot be parsed, spec -> why it is not run). Targets in
    ``unloadable`` (unsafe, unreadable) are left as they are.

    Raises:
        UsageError: running as root, a trusted target's code comes from a folder another user can change
            (:func:`root_refusal`): nothing is loaded.
    """
    unparsable: dict[str, str] = {}  # a cached config no parser can read (custom_code.RepoDataError): that repo fails
    not_run: dict[str, str] = {}
    running: list[tuple[CheckTarget, tuple[str, ...]]] = []
    prepared = []
    for target in targets:
        try:
            refs = () if target.spec in unloadable else custom_code_refs(cache_dir, target)
        except ValueError as exc:
            unparsable[target.spec] = str(exc)
            prepared.append(target)
            continue
        if refs and not trust.allows(target):
            not_run[target.spec] = (f"{NOT_RUN}: its auto_map names {refs[0]}; hfcache check --trust-remote-code "
                                    f"{target.repo_id} loads it (and runs that code)")
        elif refs:
            running.append((target, refs))
        prepared.append(replace(target, trust_remote_code=bool(refs) and target.spec not in not_run))
    reason = root_refusal(cache_dir, running)
    if reason:
        raise refuse_as_root(reason)
    return prepared, unparsable, not_run


def _probe(cache_dir: Path, targets: list[CheckTarget], text: str, timeout: float) -> dict:
    """Run the offline probe child on ``targets``; spec -> result (:func:`.check_child.probe_specs`: a target whose
    load kills the child fails alone, the others are loaded by a new child). The child's ``HF_MODULES_CACHE``
    is the caller's explicit one (as the application gets it), else a temporary folder removed afterwards; its
    ``HF_HOME`` and working folder are private temporary ones (``python -m`` puts the working folder first on
    ``sys.path``: a cache or project folder there could shadow any module). A child blocked opening a FIFO, or still
    running after ``timeout`` seconds, is killed and the target it was loading fails with that
    (:func:`.check_child.run_child`: a file swapped for a FIFO after the checks would block the load)."""
    work = Path(tempfile.mkdtemp(prefix="hfcache-check-"))  # 0700, this user's
    env = probe_environment(cache_dir, work / "home")
    explicit = os.environ.get(ENV_NAME)
    env[ENV_NAME] = explicit if explicit is not None else str(work / "modules")
    try:
        raw = probe_specs(cache_dir, text, [t.spec for t in targets], [t.spec for t in targets if t.trust_remote_code],
                          env=env, cwd=work, timeout=timeout)
    finally:
        _remove_tree(work)
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
    # transformers drops an uncached chat template silently (docs/cache-layout.md, 'Traps the libraries leave'):
    # the load "works", the app breaks.
    lost = missing_templates(cache_dir, target)
    fast, commit = data.get("fast_path"), data.get("commit")
    return CheckResult(
        target, not lost, data["class"], data["vocab_size"], tuple(data["input_ids"]), data["seconds"],
        error="loaded without its chat template(s)" if lost else None,
        cause=f"chat template(s) in the repo but not in the cache: {', '.join(lost)}" if lost else None,
        fast_path=fast if isinstance(fast, str) else None,
        commit=commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit) else None)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


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
    odd_refs = _refs_hazards(cache_dir, folder)
    if odd_refs:
        return odd_refs
    commit = target.revision if re.fullmatch(r"[0-9a-f]{40}", target.revision) else repo.refs.get(target.revision)
    commit = commit.strip() if commit else commit
    if not commit or not re.fullmatch(r"[0-9a-f]{40}", commit):
        return []
    return load_hazards(repo, commit) or _markers_hazards(cache_dir, folder, commit) \
        or _listing_hazards(cache_dir, folder, commit)


def _markers_hazards(cache_dir: Path, folder: RepoFolder, commit: str) -> list[str]:
    """A ``.no_exist/<commit>/`` folder chain deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH` (no Hub repo has
    one; a member can plant one to exhaust a recursive walk), or a folder in it swapped for a link."""
    try:
        for _ in iter_tree(cache_dir, (folder.name, ".no_exist", commit)):
            pass
    except (TooDeep, safefs.UnsafeLayout) as exc:
        return [f".no_exist/{commit[:12]}/: a folder chain deeper than {MAX_TREE_DEPTH} levels"
                if isinstance(exc, TooDeep) else str(exc)]
    except OSError:
        return []  # missing, or unreadable (reported as such: unreadable_parts)
    return []


def _refs_hazards(cache_dir: Path, folder: RepoFolder) -> list[str]:
    """Entries of ``refs/`` that are neither folders nor regular files (a FIFO or device there blocks
    huggingface_hub's plain ``open()`` of that ref in the application's load), or a ``refs/`` chain deeper than
    :data:`hfcache.bounds.MAX_TREE_DEPTH`; the scan leaves them out as no ref at all."""
    try:
        odd = [f"refs/{'/'.join((*parts, name))} is not a regular file (a FIFO, device or link)"
               for parts, name, mode in iter_tree(cache_dir, (folder.name, "refs"))
               if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))]
    except FileNotFoundError:
        return []
    except (TooDeep, safefs.UnsafeLayout) as exc:
        return [str(exc)]
    except OSError:
        return []  # an unreadable refs/ is reported as such (unreadable_parts)
    return odd[:4]


#: Largest ``trees/<commit>.json`` the child may read: huggingface_hub reads the whole listing into memory.
MAX_LISTING_BYTES = 32 * 1024 * 1024


def _listing_hazards(cache_dir: Path, folder: RepoFolder, commit: str) -> list[str]:
    """Why the child must not read ``trees/<commit>.json``: huggingface_hub 2.4 (``_tree_cache``) opens it with a
    blocking ``open()`` through any link and parses it with ``json.load`` (no size or depth bound), so a FIFO or
    device there hangs the load and a deep document raises RecursionError. Checked here, ``O_NOFOLLOW |
    O_NONBLOCK`` (:func:`safefs.read_small`): a link, FIFO, device or folder, a listing over
    :data:`MAX_LISTING_BYTES`, or JSON nested past :data:`hfcache.bounds.MAX_JSON_DEPTH` is an unsafe layout."""
    name = f"trees/{commit}.json"
    try:
        raw = safefs.read_small(cache_dir, (folder.name, "trees", f"{commit}.json"), MAX_LISTING_BYTES + 1)
    except FileNotFoundError:
        return []
    except safefs.UnsafeLayout as exc:
        link = "symlink" in str(exc)
        return [f"{name} is a symlink or sits under one" if link
                else f"{name} is not a regular file (a FIFO, device or folder)"]
    except OSError as exc:
        return [f"{name} cannot be read ({exc.strerror or exc})"]
    if len(raw) > MAX_LISTING_BYTES:
        return [f"{name} is larger than {MAX_LISTING_BYTES} bytes"]
    try:
        loads_json(raw, name)
    except TooDeep as exc:
        return [str(exc)]
    except ValueError:
        return []  # huggingface_hub ignores a listing it cannot parse
    return []
