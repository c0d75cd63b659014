"""hfcache's import graph, read with ast (nothing is imported): no cycle, and the layers of docs/architecture.md.

Every import counts, also those inside functions (a lazy import still makes the modules depend on each other),
except those under ``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hfcache"

#: The presentation layer: the only package that may import click or rich.
PRESENTATION = "hfcache.cli"
#: HTTP clients; only hfcache.hub talks to a Hub (huggingface_hub's HTTP client is httpx2), only hfcache.oci to an
#: OCI registry (oras, requests).
HTTP_CLIENTS = {"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3", "aiohttp", "http.client", "urllib.request", "oras", "boto3", "botocore"}
NETWORK_MODULES = {"hfcache.hub.client", "hfcache.oci.registry", "hfcache.bucket.store"}  # oras-py, boto3
#: huggingface_hub names that are not its HTTP side: reading the saved token is a file read.
HUB_LOCAL_NAMES = {"huggingface_hub.utils": {"get_token"}}

#: The layers of docs/architecture.md, top first. A module may import modules of its own room (subpackage or leaf)
#: and of rooms in lower layers, never of a higher layer or of another room of its own layer. The facade
#: (``hfcache/__init__.py``, ``__main__.py``) stands above them all.
LAYERS = (
    ("hfcache.cli",),
    ("hfcache.serve", "hfcache.fleet"),
    ("hfcache.oci", "hfcache.bucket"),
    ("hfcache.offline", "hfcache.prune", "hfcache.move"),
    ("hfcache.integrity",),
    ("hfcache.warming",),
    ("hfcache.hub",),
    ("hfcache.cache",),
    ("hfcache.pace",),
    ("hfcache.records", "hfcache.units", "hfcache.pools"),
    ("hfcache.names",),
    ("hfcache.errors", "hfcache._version", "hfcache.bounds"),
)
FACADE = {"hfcache", "hfcache.__main__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, *, top_level_only: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """(imported module, names) for every import statement of ``module`` that can run."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, tuple[str, ...]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, ()) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append((target, tuple(alias.name for alias in child.names)))
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _internal_edges(module: str, *, top_level_only: bool = False) -> set[str]:
    """The hfcache modules ``module`` imports (``from . import x`` names the submodule x)."""
    edges = set()
    for target, names in _imports(module, top_level_only=top_level_only):
        submodules = {f"{target}.{name}" for name in names} & MODULES.keys()
        if submodules:
            edges |= submodules
        elif target in MODULES:
            edges.add(target)
    edges.discard(module)
    return edges


GRAPH = {module: _internal_edges(module) for module in MODULES}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _external(module: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(target, names) for target, names in _imports(module) if not target.startswith("hfcache")]


def test_the_walk_sees_the_package():
    # A walk that found nothing would pass every check below.
    assert {"hfcache.cli.main", "hfcache.hub.client", "hfcache.serve.vocabulary", "hfcache.serve.hub_server"} <= MODULES.keys()
    assert "hfcache.serve.vocabulary" in GRAPH["hfcache.serve.cache_store"]
    assert "hfcache.hub.client" in GRAPH["hfcache.warming.orchestrate"]


def test_find_cycle_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def _room(module: str) -> tuple[int, str]:
    """(layer index, room) of a module: the first entry of LAYERS that is the module or a package holding it."""
    for rank, rooms in enumerate(LAYERS):
        for room in rooms:
            if module == room or module.startswith(room + "."):
                return rank, room
    raise AssertionError(f"{module} is in no layer of LAYERS: place it (and say why in docs/architecture.md)")


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer or sideways into another room of the same layer, as 'a -> b' lines."""
    breaches = []
    for module in sorted(graph):
        if module in FACADE:
            continue
        rank, room = _room(module)
        for target in sorted(graph[module]):
            if target in FACADE:
                breaches.append(f"{module} -> {target} (the facade)")
                continue
            target_rank, target_room = _room(target)
            if target_room != room and target_rank <= rank:
                breaches.append(f"{module} -> {target}")
    return breaches


def test_layer_check_finds_a_planted_breach():
    planted = {**GRAPH, "hfcache.cache.scan": GRAPH["hfcache.cache.scan"] | {"hfcache.warming.selection"},
               "hfcache.prune.policy": GRAPH["hfcache.prune.policy"] | {"hfcache.move.export"}}
    assert _layer_breaches(planted) == ["hfcache.cache.scan -> hfcache.warming.selection",
                                        "hfcache.prune.policy -> hfcache.move.export"]
    with pytest.raises(AssertionError, match="in no layer"):
        _room("hfcache.newroom")


def test_every_module_has_a_layer():
    for module in MODULES:
        if module not in FACADE:
            _room(module)


def test_imports_follow_the_layers():
    breaches = _layer_breaches(GRAPH)
    assert not breaches, "imports against the layers of docs/architecture.md:\n" + "\n".join(breaches)


def test_no_import_cycle():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_presentation_layer_imports_click_or_rich(module):
    if module == PRESENTATION or module.startswith(PRESENTATION + "."):
        return
    ui = [target for target, _ in _external(module) if target.split(".")[0] in ("click", "rich")]
    assert not ui, f"{module} is a core module but imports {ui}: rendering belongs in hfcache.cli"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_hub_imports_http_clients_and_huggingface_hubs_http_side(module):
    # session: makes the client ahead of its first request; bodies_client: a client of signed URLs (pull s3://)
    if module in ("hfcache.hub.client", "hfcache.hub.session", "hfcache.hub.bodies_client"):
        return
    offending = []
    for target, names in _external(module):
        if (target in HTTP_CLIENTS or target.split(".")[0] in HTTP_CLIENTS) and module not in NETWORK_MODULES:
            offending.append(target)
        elif target.split(".")[0] == "huggingface_hub" and (
                not names or not set(names) <= HUB_LOCAL_NAMES.get(target, set())):
            offending.append(f"{target}: {', '.join(names) or '*'}")
    assert not offending, f"{module} talks HTTP but only {sorted(NETWORK_MODULES)} may: {offending}"


def test_errors_imports_nothing_from_hfcache():
    assert GRAPH["hfcache.errors"] == set()


def test_serve_vocabulary_imports_nothing_of_the_server_side():
    assert not {m for m in GRAPH["hfcache.serve.vocabulary"] if m.startswith("hfcache.serve")}


def test_stores_do_not_import_the_http_layer():
    for store in ("hfcache.serve.folder_store", "hfcache.serve.cache_store"):
        allowed = {"hfcache.serve.vocabulary", "hfcache.cache.scan",
                   "hfcache.cache.safefs", "hfcache.cache.shared_store",  # the safe opens of a blob
                   "hfcache.cache.fsops", "hfcache.bounds",  # bounded walks and JSON (standard library only)
                   "hfcache.names", "hfcache.records", "hfcache.cache.content"}  # names and hashing: leaves
        assert GRAPH[store] <= allowed, store


@pytest.mark.parametrize("module", ["hfcache.warming.lockfile", "hfcache.warming.project", "hfcache.warming.run", "hfcache.records",
                                    "hfcache.cli.main", "hfcache.cli.render.warm"])
def test_warm_lock_fast_path_does_not_import_huggingface_hub_at_import_time(module):
    """``warm --lock`` on a satisfied cache must not pay for huggingface_hub's import (warming/run.py)."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        heavy = [t for t, _ in _imports(current, top_level_only=True) if t.split(".")[0] == "huggingface_hub"]
        assert not heavy, f"{module} imports huggingface_hub at import time through {current}"
        todo.extend(_internal_edges(current, top_level_only=True))
        todo.extend(p for p in (current.rpartition(".")[0],) if p in MODULES)  # a package's __init__ runs first


def test_warm_lock_modules_really_import_without_huggingface_hub():
    """The same promise at run time: importing what ``warm --lock`` runs on a warm cache leaves huggingface_hub
    (and its HTTP client) unimported."""
    modules = "hfcache, hfcache.cli.main, hfcache.warming.project, hfcache.warming.run, hfcache.warming.lockfile, hfcache.cli.render.warm"
    code = (f"import sys, {modules}\n"
            "print(sorted(m for m in ('huggingface_hub', 'httpx', 'httpx2') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_the_session_thread_imports_nothing_the_main_thread_is_importing():
    """hub/session.py builds the HTTP client in a thread while the main thread imports hfcache.warming.orchestrate: the two sets
    of modules must not meet, or CPython may raise _DeadlockError in one of them (hub/session.py). Measured in a real
    interpreter: what warming imports after prepare_session's own import, against what building the client
    imports."""
    code = (
        "import sys\n"
        "from huggingface_hub.utils import get_session\n"
        "before = set(sys.modules)\n"
        "import hfcache.warming.orchestrate, hfcache.cli.main, hfcache.warming.run\n"
        "main = set(sys.modules) - before\n"
        "get_session()\n"
        "thread = set(sys.modules) - before - main\n"
        "from hfcache.hub.session import CLIENT_MODULES\n"
        "print(sorted(m for m in main if m.split('.')[0] in CLIENT_MODULES),\n"
        "      sorted({m.split('.')[0] for m in thread} - set(CLIENT_MODULES)), bool(thread))\n")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[] [] True", out.stdout
