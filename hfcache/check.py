"""check: prove that each tokenizer of a cache loads offline, as the application will load it.

A child process (``python -m hfcache.probe``) runs with ``HF_HUB_OFFLINE=1``, ``HF_HUB_CACHE`` set to the cache,
``HF_ENDPOINT`` on a closed loopback port and an audit hook that fails any connection attempt at once. It calls
``AutoTokenizer.from_pretrained(<id>, revision=...)`` for every tokenizer and encodes a probe text. When a load fails,
the parent looks at the cache and names the missing piece (DESIGN §3): no ``config.json`` and no ``.no_exist``
marker, a missing Python package, a chat template the repo has but the cache lacks, a missing ref.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .cache import RepoFolder
from .errors import CheckFailed, HfcacheError, InternalError
from .lockfile import Lockfile
from .scan import scan_cache
from .selection import tokenizer_paths

DEFAULT_TEXT = "Hello world, 深度学习技术正在改变世界"
_PACKAGE_HINTS = (("sentencepiece", "sentencepiece"), ("protobuf", "protobuf"), ("tiktoken", "tiktoken"),
                  ("mistral_common", "mistral-common"), ("mistral-common", "mistral-common"))


@dataclass(frozen=True)
class CheckTarget:
    """A tokenizer to load: ``repo_id`` as the application passes it, at ``revision``; ``chat_templates`` the
    template files the repo has (from a lock), to spot ones missing from the cache."""

    repo_id: str
    revision: str = "main"
    repo_type: str = "model"
    chat_templates: tuple[str, ...] = ()

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


def targets_from_cache(cache_dir: Path, repo_ids: set[str] | None) -> list[CheckTarget]:
    """Every model repo of the cache with a ref whose snapshot holds tokenizer files."""
    targets = []
    for repo in scan_cache(cache_dir, repo_ids).repos:
        if repo.repo_type != "model":
            continue
        for ref, commit in sorted(repo.refs.items()):
            revision = next((r for r in repo.revisions if r.commit_hash == commit.strip()), None)
            if revision and tokenizer_paths(f.path for f in revision.files) - {"config.json"}:
                targets.append(CheckTarget(repo.repo_id, ref))
        if repo.unsafe:
            targets.append(CheckTarget(repo.repo_id, "main"))  # reported as unsafe, never loaded
            continue
        if repo_ids and repo.repo_id in repo_ids and not repo.refs:
            targets.append(CheckTarget(repo.repo_id, "main"))
    return targets


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

    Raises:
        InternalError: the child crashed or printed no result.
    """
    # A repo folder with a planted link is not loaded: transformers would read whatever the link points to.
    unsafe = {t.spec: RepoFolder(cache_dir, t.repo_id, t.repo_type).layout_problems() for t in targets}
    loadable = [t for t in targets if not unsafe[t.spec]]
    raw = _probe(cache_dir, loadable, text, timeout) if loadable else {}
    results = []
    for target in targets:
        if unsafe[target.spec]:
            results.append(CheckResult(target, False, error="not loaded: unsafe cache layout",
                                       cause="; ".join(unsafe[target.spec])))
            continue
        data = raw.get(target.spec, {"error": "no result"})
        if "error" in data:
            results.append(CheckResult(target, False, seconds=data.get("seconds", 0.0), error=data["error"],
                                       cause=diagnose(cache_dir, target, data["error"])))
        else:
            # transformers drops an uncached chat template silently (DESIGN §3): the load "works", the app breaks.
            lost = _missing_templates(cache_dir, target)
            results.append(CheckResult(
                target, not lost, data["class"], data["vocab_size"], tuple(data["input_ids"]), data["seconds"],
                error="loaded without its chat template(s)" if lost else None,
                cause=f"chat template(s) in the repo but not in the cache: {', '.join(lost)}" if lost else None))
    return CheckReport(cache_dir=str(cache_dir), text=text, results=tuple(results),
                       import_seconds=raw.get("__import_seconds__", {}).get("seconds", 0.0))


def _probe(cache_dir: Path, targets: list[CheckTarget], text: str, timeout: float) -> dict:
    """Run the offline probe child on ``targets``; its JSON answer (spec -> result)."""
    env = probe_environment(cache_dir)
    home = Path(env["HF_HOME"])
    try:
        proc = subprocess.run([sys.executable, "-m", "hfcache.probe", text, *[t.spec for t in targets]],
                              capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        _remove_tree(home)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InternalError(f"the offline probe process failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _missing_templates(cache_dir: Path, target: CheckTarget) -> list[str]:
    """The target's chat templates (known from a lock) that its cached snapshot lacks."""
    if not target.chat_templates:
        return []
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    try:
        commit = (folder.read_ref(target.revision) or target.revision.encode()).decode("utf-8", "replace").strip()
    except (OSError, HfcacheError):
        commit = target.revision
    snapshot = folder.root / "snapshots" / commit
    return [t for t in target.chat_templates if not (snapshot / t).exists()]


def diagnose(cache_dir: Path, target: CheckTarget, error: str) -> str | None:
    """Name the missing piece behind a failed offline load, from the cache's contents and the error text."""
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
        return "a file the load needs is neither cached nor marked absent (.no_exist)"
    return None
