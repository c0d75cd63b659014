"""check: prove that each tokenizer of a cache loads offline, as the application will load it.

A child process (:mod:`.check_child`, environment: :func:`probe_environment`) runs
``AutoTokenizer.from_pretrained(<id>, revision=...)`` for every target (:mod:`.check_targets`), then encodes a probe
text; a failed load is explained from the cache (:mod:`.diagnosis`). Custom code (``auto_map``) runs only for the
repos the user opted in for (:mod:`.check_trust`).
"""

from __future__ import annotations

import importlib.util
import os
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
from ..names import is_commit
from ..warming.modules_cache import ENV_NAME
from .check_child import probe_specs
from .check_targets import CheckTarget, custom_code_refs, unreadable_parts
from .check_trust import NOT_RUN, TrustPolicy, refuse_as_root, root_refusal
from .diagnosis import diagnose, missing_templates

DEFAULT_TEXT = "Hello world, 深度学习技术正在改变世界"
#: Why a kernel repo is skipped (listed so that a named or locked one is not a failure; it counts as passed).
KERNEL_SKIP = "a kernel repo has no tokenizer: nothing to load (verify checks its files)"
#: Largest ``trees/<commit>.json`` the child may read: huggingface_hub reads the whole listing into memory.
MAX_LISTING_BYTES = 32 * 1024 * 1024
#: Seconds each tokenizer may take in check's child from its start (load, encode, fast-path comparison: half of it),
#: past which it alone fails; ``HFCACHE_CHECK_REPO_TIMEOUT`` sets it.
REPO_TIMEOUT = 120.0
#: The child's address-space limit (``RLIMIT_AS``): a load that would take more ends only that child (its tokenizer
#: fails); ``HFCACHE_CHECK_MEMORY`` sets it (a size, ``0``: none).
MEMORY = 8 * 1024**3


@dataclass(frozen=True)
class CheckResult:
    """One tokenizer's load: ``ok`` when it loaded and encoded the text (``tokenizer_class``, ``vocab_size``,
    ``input_ids``, load ``seconds`` in the child), else the ``error`` it raised and hfcache's diagnosis (``cause``).
    ``skipped``: why nothing was loaded (a kernel repo; ``not_run``: custom code not opted in to). ``fast_path``: the
    fast path's verdict (``equal``, ``differs: ...``, ``refused: <reason>``) for ``commit`` (the record's key)."""

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


@dataclass(frozen=True)
class CheckReport:
    """Every result, in the targets' order; ``fast_recorded``: whether the fast-path verdicts were recorded
    (:mod:`.fast_record`), None when none was proved."""

    cache_dir: str
    text: str
    results: tuple[CheckResult, ...]
    import_seconds: float
    fast_recorded: bool | None = None

    @property
    def ok(self) -> bool:
        """No load failed, and something loaded unless nothing needed a load (all not opted in to: not a pass)."""
        if not all(r.ok for r in self.results):
            return False
        return not any(r.not_run for r in self.results) or any(r.ok and not r.skipped for r in self.results)

    @property
    def not_run(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.not_run)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else CheckFailed.exit_code


def probe_environment(cache_dir: Path, home: Path) -> dict[str, str]:
    """The child's environment: the caller's minus every HF_/TRANSFORMERS_/HUGGINGFACE_ setting, plus offline mode,
    ``HF_HUB_CACHE``, ``HF_HOME`` at ``home`` (private: never below the cache, where a member could plant what the
    child reads) and ``HF_ENDPOINT`` on a loopback port nothing listens on (a stray request is refused at once)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=str(cache_dir), HF_HOME=str(home),
               HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_UPDATE_CHECK="1",
               HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
    return env


def check_tokenizers(cache_dir: Path, targets: list[CheckTarget], text: str = DEFAULT_TEXT,
                     timeout: float = 600, trust: TrustPolicy | None = None) -> CheckReport:
    """Load every target in an offline child process and diagnose the failures; a kernel repo's target is skipped
    (:data:`KERNEL_SKIP`). A target whose load raises, panics, kills the child or runs past its own budget
    (:func:`limits`) fails alone.

    Args:
        cache_dir (Path): the cache; targets (list[CheckTarget]): what to load; text (str): the probe text.
        timeout (float): seconds the children may take in all; past it, the targets not begun fail saying so.
        trust (TrustPolicy | None): the targets whose custom code may run [default: none]; any other target that
            needs it is not loaded (``not_run``).

    Raises:
        UsageError: transformers is not installed (exit 2: the extra ``check``, found with ``find_spec``, not
            imported); as root, a trusted target's code comes from a folder another user can change; a malformed
            ``HFCACHE_CHECK_*`` setting. InternalError: the child ended before it loaded anything.
    """
    loaded = [t for t in targets if t.repo_type != "kernel"]
    if loaded and importlib.util.find_spec("transformers") is None:
        raise UsageError("hfcache check loads each tokenizer with transformers, which is not installed",
                         hint="pip install 'hfcache[check]'")
    budgets = (timeout, *limits())
    report = _load_tokenizers(cache_dir, loaded, text, budgets, trust or TrustPolicy()) if loaded else \
        CheckReport(cache_dir=str(cache_dir), text=text, results=(), import_seconds=0.0)
    results = iter(report.results)
    merged = tuple(CheckResult(t, True, skipped=KERNEL_SKIP) if t.repo_type == "kernel" else next(results)
                   for t in targets)
    return replace(report, results=merged, fast_recorded=_record_fast_path(cache_dir, merged))


def limits() -> tuple[float, int]:
    """(seconds each tokenizer may take, the child's address-space bytes; 0: no limit): ``HFCACHE_CHECK_REPO_TIMEOUT``
    (seconds) and ``HFCACHE_CHECK_MEMORY`` (a size: ``8GiB``), else :data:`REPO_TIMEOUT` and :data:`MEMORY`.
    UsageError: a value that is no number of seconds above 0 or no size."""
    from ..units import parse_size, parse_timeout

    seconds, memory = os.environ.get("HFCACHE_CHECK_REPO_TIMEOUT", ""), os.environ.get("HFCACHE_CHECK_MEMORY", "")
    try:
        return (parse_timeout(seconds) if seconds.strip() else REPO_TIMEOUT,
                parse_size(memory) if memory.strip() else MEMORY)
    except UsageError as exc:
        raise UsageError(f"HFCACHE_CHECK_REPO_TIMEOUT / HFCACHE_CHECK_MEMORY: {exc.message}", hint=exc.hint) from None


def _record_fast_path(cache_dir: Path, results: tuple[CheckResult, ...]) -> bool | None:
    """Record each proved verdict by repo and commit (:mod:`.fast_record`); whether it was written (None: none)."""
    import tokenizers

    from . import fast_record

    verdicts = {fast_record.key(r.target.repo_type, r.target.repo_id, r.commit): r.fast_path for r in results
                if r.commit and r.fast_path and not r.fast_path.startswith("refused")}
    return fast_record.save(str(cache_dir), verdicts, tokenizers.__version__) if verdicts else None


def _load_tokenizers(cache_dir: Path, targets: list[CheckTarget], text: str, budgets: tuple[float, float, int],
                     trust: TrustPolicy) -> CheckReport:
    """Load the targets that may be loaded in the probe child; the others fail (or are not run) with why: an unsafe
    layout (a planted link, a FIFO, a link leaving the repo: the load would read it or block), a part this user
    cannot read, a repo the cache does not hold (transformers would only name the closed endpoint), configs no
    parser reads, custom code not opted in to (:func:`_prepare`)."""
    unsafe = {t.spec: _hazards(cache_dir, t) for t in targets}
    blocked = _blocked(cache_dir, targets, unsafe)
    absent = {t.spec for t in targets if t.spec not in blocked
              and not os.path.lexists(RepoFolder(cache_dir, t.repo_id, t.repo_type).root)}
    targets, unparsable, not_run = _prepare(cache_dir, targets, {s for s in unsafe if unsafe[s]} | set(blocked), trust)
    loadable = [t for t in targets if not unsafe[t.spec] and t.spec not in blocked and t.spec not in unparsable
                and t.spec not in absent and t.spec not in not_run]
    raw = _probe(cache_dir, loadable, text, budgets) if loadable else {}
    results = []
    for target in targets:
        spec = target.spec
        if spec in not_run:
            results.append(CheckResult(target, True, skipped=not_run[spec], not_run=True))
        elif unsafe[spec]:
            results.append(CheckResult(target, False, error="not loaded: unsafe cache layout",
                                       cause="; ".join(unsafe[spec])))
        elif spec in blocked:
            parts = blocked[spec]
            shown = ", ".join(parts[:4]) + (f" (and {len(parts) - 4} more)" if len(parts) > 4 else "")
            results.append(CheckResult(
                target, False, error="PermissionError: part of the repo cannot be read",
                cause=f"{shown} cannot be read by this user (permission denied): the application's offline load of "
                      f"{target.repo_id} needs {'it' if len(parts) == 1 else 'them'}; ask the cache's owner to make "
                      "it group-readable (`hfcache doctor` prints the fix)"))
        elif spec in absent:
            folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
            missing = f"{target.repo_id} is not in the cache (no {folder.name}/): hfcache warm {target.repo_id}"
            results.append(CheckResult(target, False, error=missing, cause=missing))
        elif spec in unparsable:
            why = unparsable[spec]
            results.append(CheckResult(target, False, error=why,
                                       cause=f"{target.repo_id}: {why}: no loader can read it (fix the repo)"))
        else:
            results.append(_result(cache_dir, target, raw))
    return CheckReport(cache_dir=str(cache_dir), text=text, results=tuple(results),
                       import_seconds=raw.get("__import_seconds__", {}).get("seconds", 0.0))


def _blocked(cache_dir: Path, targets: list[CheckTarget], unsafe: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    """spec -> :func:`unreadable_parts` of each target (safe layout) whose repo has some; one look per repo folder."""
    denied: dict[tuple[str, str], tuple[str, ...]] = {}
    for t in targets:
        if not unsafe[t.spec] and (t.repo_id, t.repo_type) not in denied:
            denied[(t.repo_id, t.repo_type)] = unreadable_parts(cache_dir, t)
    return {t.spec: denied[(t.repo_id, t.repo_type)] for t in targets
            if not unsafe[t.spec] and denied[(t.repo_id, t.repo_type)]}


def _prepare(cache_dir: Path, targets: list[CheckTarget], unloadable: set[str],
             trust: TrustPolicy) -> tuple[list[CheckTarget], dict[str, str], dict[str, str]]:
    """(the targets with ``trust_remote_code`` set where ``trust`` allows the code their configs name, spec -> why
    its configs cannot be parsed, spec -> why it is not run); targets in ``unloadable`` are left as they are.
    UsageError: :func:`.check_trust.root_refusal` refuses the code as root (nothing is loaded)."""
    unparsable: dict[str, str] = {}
    not_run: dict[str, str] = {}
    running: list[tuple[CheckTarget, tuple[str, ...]]] = []
    prepared = []
    for target in targets:
        try:
            refs = () if target.spec in unloadable else custom_code_refs(cache_dir, target)
        except ValueError as exc:  # a cached config no parser can read (custom_code.RepoDataError)
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


def _probe(cache_dir: Path, targets: list[CheckTarget], text: str, budgets: tuple[float, float, int]) -> dict:
    """spec -> the probe child's result (:func:`.check_child.probe_specs`; ``budgets``: the overall timeout, each
    target's, the child's memory), in a private temporary working folder (never a cache or project folder that could
    shadow a module) holding the child's ``HF_HOME`` and, unless the caller set one, ``HF_MODULES_CACHE``."""
    timeout, repo_timeout, memory = budgets
    work = Path(tempfile.mkdtemp(prefix="hfcache-check-"))  # 0700, this user's
    env = probe_environment(cache_dir, work / "home")
    env[ENV_NAME] = os.environ.get(ENV_NAME, str(work / "modules"))
    try:
        raw = probe_specs(cache_dir, text, [t.spec for t in targets], [t.spec for t in targets if t.trust_remote_code],
                          env=env, cwd=work, timeout=timeout, repo_timeout=repo_timeout, memory=memory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    offline = "the Hub (hfcache check is offline)"  # the child's HF_ENDPOINT is a closed port of ours
    for data in raw.values():
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            data["error"] = data["error"].replace(f"'{env['HF_ENDPOINT']}'", offline).replace(env["HF_ENDPOINT"],
                                                                                             offline)
    return raw


def _result(cache_dir: Path, target: CheckTarget, raw: dict) -> CheckResult:
    data = raw.get(target.spec, {"error": "no result"})
    if "error" in data:
        return CheckResult(target, False, seconds=data.get("seconds", 0.0), error=data["error"],
                           cause=diagnose(cache_dir, target, data["error"]))
    # transformers drops an uncached chat template silently (docs/cache-layout.md, 'Traps the libraries leave')
    lost = missing_templates(cache_dir, target)
    fast, commit = data.get("fast_path"), data.get("commit")
    return CheckResult(
        target, not lost, data["class"], data["vocab_size"], tuple(data["input_ids"]), data["seconds"],
        error="loaded without its chat template(s)" if lost else None,
        cause=f"chat template(s) in the repo but not in the cache: {', '.join(lost)}" if lost else None,
        fast_path=fast if isinstance(fast, str) else None, commit=commit if is_commit(commit) else None)


def _hazards(cache_dir: Path, target: CheckTarget) -> list[str]:
    """Why ``target`` must not be loaded (planted links in its repo folder, :func:`hfcache.cache.scan.load_hazards`,
    odd ``refs/``, ``.no_exist/`` or ``trees/`` entries); empty when it may be."""
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
    commit = target.revision if is_commit(target.revision) else repo.refs.get(target.revision)
    commit = commit.strip() if commit else commit
    if not is_commit(commit):
        return []
    return load_hazards(repo, commit) or _markers_hazards(cache_dir, folder, commit) \
        or _listing_hazards(cache_dir, folder, commit)


def _markers_hazards(cache_dir: Path, folder: RepoFolder, commit: str) -> list[str]:
    """A ``.no_exist/<commit>/`` folder chain deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH` (a member can plant
    one to exhaust a recursive walk), or a folder in it swapped for a link."""
    try:
        for _ in iter_tree(cache_dir, (folder.name, ".no_exist", commit)):
            pass
    except TooDeep:
        return [f".no_exist/{commit[:12]}/: a folder chain deeper than {MAX_TREE_DEPTH} levels"]
    except safefs.UnsafeLayout as exc:
        return [str(exc)]
    except OSError:
        return []  # missing, or unreadable (reported as such: unreadable_parts)
    return []


def _refs_hazards(cache_dir: Path, folder: RepoFolder) -> list[str]:
    """Entries of ``refs/`` that are neither folders nor regular files (a FIFO there blocks huggingface_hub's plain
    ``open()`` of that ref), or a ``refs/`` chain past the depth bound; the scan leaves them out as no ref at all."""
    try:
        odd = [f"refs/{'/'.join((*parts, name))} is not a regular file (a FIFO, device or link)"
               for parts, name, mode in iter_tree(cache_dir, (folder.name, "refs"))
               if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))]
    except (TooDeep, safefs.UnsafeLayout) as exc:
        return [str(exc)]
    except OSError:
        return []  # missing, or unreadable (reported as such: unreadable_parts)
    return odd[:4]


def _listing_hazards(cache_dir: Path, folder: RepoFolder, commit: str) -> list[str]:
    """Why the child must not read ``trees/<commit>.json``: huggingface_hub 2.4 (``_tree_cache``) opens it with a
    blocking ``open()`` through any link and ``json.load``-s it (no bound): a link, FIFO, device or folder, a
    listing over :data:`MAX_LISTING_BYTES`, or JSON nested past :data:`hfcache.bounds.MAX_JSON_DEPTH` is unsafe."""
    name = f"trees/{commit}.json"
    try:
        raw = safefs.read_small(cache_dir, (folder.name, "trees", f"{commit}.json"), MAX_LISTING_BYTES + 1)
    except FileNotFoundError:
        return []
    except safefs.UnsafeLayout as exc:
        return [f"{name} is a symlink or sits under one" if "symlink" in str(exc)
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
        pass  # huggingface_hub ignores a listing it cannot parse
    return []
