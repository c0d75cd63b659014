"""Filesystem discipline, read with ast (nothing is imported): below a cache root, every create, chmod/chown,
rename, copy and write acts through the descriptors the safety walk opened (docs/security.md, "Group members").

A group member of a shared cache can swap any folder for a symlink between a check and a use
(tests/integration/test_shared_cache_races.py). A call that rebuilds a path afterwards
(``os.replace(staged, folder.blob_path(etag))``, ``shutil.copyfile``, ``os.chmod(path)``, ``open(path, "w")``) follows
that link. This test fails where a module other than the safe primitives (``hfcache/cache/safefs.py``,
``hfcache/cache/safefs_tree.py``) calls one of:

- ``os.chmod``, ``os.chown``, ``os.lchown``, ``os.replace``, ``os.rename``, ``os.link``, ``os.symlink``,
  ``os.mkdir``, ``os.makedirs`` without ``dir_fd=``/``src_dir_fd=``/``dst_dir_fd=``;
- ``os.open`` with a creating or writing flag (``O_CREAT``, ``O_WRONLY``, ``O_RDWR``, ``O_TRUNC``,
  ``O_APPEND``) without ``dir_fd=``;
- ``shutil.copy``, ``copy2``, ``copyfile``, ``copytree``, ``move``, ``rmtree``;
- ``open(..., mode)`` / ``io.open`` / ``X.open(mode)`` with a writing mode (``w``, ``a``, ``x``, ``+``), and the
  ``pathlib`` writers ``write_text``, ``write_bytes``, ``mkdir``, ``touch``, ``chmod``, ``lchmod``,
  ``symlink_to``, ``hardlink_to`` (any receiver), and ``.rename``/``.replace`` on a receiver that is surely a
  path (``a / "b"``, ``Path(...)``: ``str.replace`` is everywhere);
- hfcache's own path-based helpers (``atomic_write``, ``atomic_output``, ``share_file``, ``share_dir``), kept for
  paths outside a cache;

unless the (module, function) is in :data:`ALLOWED` (each with the reason it never acts below a cache root, or
acts only where no member can write).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hfcache"

#: The safe primitives themselves: every call there is relative to a folder fd opened without following links.
EXEMPT_MODULES = {"hfcache.cache.safefs", "hfcache.cache.safefs_tree"}

PATH_CALLS_OS = {"chmod", "chown", "lchown", "replace", "rename", "link", "symlink", "mkdir", "makedirs"}
PATH_CALLS_SHUTIL = {"copy", "copy2", "copyfile", "copytree", "move", "rmtree"}
WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}
PATHLIB_WRITERS = {"write_text", "write_bytes", "mkdir", "touch", "chmod", "lchmod", "symlink_to", "hardlink_to"}
FD_KEYWORDS = {"dir_fd", "src_dir_fd", "dst_dir_fd"}
#: hfcache's own path-based helpers: kept for paths outside a cache, so every caller is listed with its reason.
PATH_HELPERS = {"atomic_write", "atomic_output", "share_file", "share_dir"}

#: (module, function) -> why a path-based call there never acts below a cache root a member can write.
ALLOWED: dict[tuple[str, str], str] = {
    ("hfcache.cache.atomic", "atomic_write"):
        "the path-based writer itself (atomic_output): documented for paths OUTSIDE a cache only",
    ("hfcache.cache.atomic", "file_lock"):
        "mkdir of the lock's folder only without cache_dir and dir_fd: a lock outside any cache",
    ("hfcache.cache.root", "ensure_cache_root"):
        "mkdir -p of the cache root itself and its parents: the root is the user's choice, nothing below it",
    ("hfcache.cache.locking", "_probe_file"):
        "flock probe in a folder named /proc/self/fd/<fd> (via_dir_fd): O_TMPFILE, else O_EXCL of a random name",
    ("hfcache.cli.move", "export_command"):
        "atomic_output of the export tar at the user's DEST (outside the source cache: export refuses that)",
    ("hfcache.fleet.sync", "_write_readiness"):
        "mkdir and atomic_write of sync's --ready-dir files: outside the cache (sync_once refuses one inside it)",
    ("hfcache.warming.lockfile", "write_lock"):
        "atomic_write of the project's hfcache.lock next to its manifest: outside any cache",
    ("hfcache.oci.image", "_write_layers"):
        "push's private TemporaryDirectory (0700, this user's, in TMPDIR): outside any cache",
    ("hfcache.serve.mirror", "_open_access_log"):
        "the --access-log file the operator named: outside any cache",
    ("hfcache.warming.modules_cache", "private_modules_dir"):
        "mkdir 0700 of hfcache-modules-<uid> in TMPDIR (never follows a planted link: mkdir fails on any entry)",
    ("hfcache.integrity.check", "_probe"):
        "rmtree of check's own mkdtemp folder (0700, this user's, in TMPDIR): outside any cache",
    ("hfcache.offline.probe", "_report"):
        "append to the progress file check's parent names in its own mkdtemp folder (0700, in TMPDIR): outside any cache",
    ("hfcache.move.destination", "open_parent"):
        "mkdir -p of the user's DEST parent of export and link (outside the cache, refuse_dest_inside); the tree "
        "or link itself is made by fd",
}

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _writing_mode(mode: str | None) -> bool:
    return mode is not None and any(c in mode for c in "wax+")


def _names_in(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Name):
            found.add(sub.id)
    return found


def _is_path_expr(node: ast.AST) -> bool:
    """An expression that is a pathlib path for sure: ``a / "b"`` or ``Path(...)``/``PurePath(...)``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Path", "PosixPath")


class _Finder(ast.NodeVisitor):
    """Collects (function qualname, line, call text) of every path-based filesystem write."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.found: list[tuple[str, int, str]] = []
        self.aliases: dict[str, str] = {}  # local name -> "os.replace" for `from os import replace`

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in ("os", "shutil"):
            for alias in node.names:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _scoped(self, node: ast.AST) -> None:
        self.stack.append(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        what = self._offence(node)
        if what:
            self.found.append((".".join(self.stack) or "<module>", node.lineno, what))
        self.generic_visit(node)

    def _qualified(self, func: ast.AST) -> str | None:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return f"{func.value.id}.{func.attr}"
        if isinstance(func, ast.Name):
            return self.aliases.get(func.id, func.id)
        return None

    def _offence(self, node: ast.Call) -> str | None:
        keywords = {k.arg for k in node.keywords}
        fd_based = bool(keywords & FD_KEYWORDS)
        name = self._qualified(node.func)
        if name is not None:
            mod, _, attr = name.rpartition(".")
            if mod == "os" and attr in PATH_CALLS_OS and not fd_based:
                return name
            if mod == "os" and attr == "open" and not fd_based and len(node.args) > 1 \
                    and _names_in(node.args[1]) & WRITE_FLAGS and "devnull" not in _names_in(node.args[0]):
                return "os.open(..., writing flags)"
            if mod == "shutil" and attr in PATH_CALLS_SHUTIL and not fd_based:  # rmtree(name, dir_fd=): no link
                return name
            if attr in PATH_HELPERS:
                return f"{attr} (path-based helper)"
            if name in ("open", "io.open"):
                mode = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "mode"), None)
                return "open(..., writing mode)" if _writing_mode(_const_str(mode)) else None
        if isinstance(node.func, ast.Attribute) and not (isinstance(node.func.value, ast.Name)
                                                         and node.func.value.id in ("os", "shutil", "io")):
            attr = node.func.attr
            if attr in PATHLIB_WRITERS and not fd_based:
                return f".{attr}()"
            if attr in PATH_HELPERS:
                return f"{attr} (path-based helper)"
            if attr in ("rename", "replace") and _is_path_expr(node.func.value):  # (a / "b").replace(c)
                return f".{attr}()"
            if attr == "open" and "fileobj" not in keywords:  # tarfile.open(fileobj=...): a stream, not a path
                mode = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg == "mode"), None)
                if _writing_mode(_const_str(mode)):
                    return ".open(writing mode)"
        return None


def offenders_in(source: str) -> list[tuple[str, int, str]]:
    """(function qualname, line, what) for each path-based filesystem write in ``source``."""
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


def _all_offenders() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module in EXEMPT_MODULES:
            continue
        for func, line, what in offenders_in(path.read_text(encoding="utf-8")):
            out.setdefault((module, func), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    return out


OFFENDERS = _all_offenders()


def test_no_path_based_write_outside_the_safe_primitives():
    unexpected = {key: where for key, where in OFFENDERS.items() if key not in ALLOWED}
    assert not unexpected, "path-based filesystem calls (act through safefs / *_at with the folder's fd):\n" + \
        "\n".join(f"  {w}" for where in unexpected.values() for w in where)


#: Rooms whose entries must stay exact (a stale entry fails); entries for modules other engineers are reworking now
#: are not held to it until the lead has merged them.
EXACT_ROOMS = ("hfcache.cache.", "hfcache.prune.", "hfcache.move.import")


@pytest.mark.parametrize("key", sorted(k for k in ALLOWED if k[0].startswith(EXACT_ROOMS)))
def test_allow_list_entries_still_needed(key):
    """An allow-list entry that no longer offends is removed, so that the list stays the exact set of exceptions."""
    assert key in OFFENDERS, f"{key} is allowed but makes no path-based call any more: remove it from ALLOWED"


def test_allow_list_entries_give_a_reason():
    for key, reason in ALLOWED.items():
        assert len(reason) > 20, key


PLANTED = '''
import os, shutil
from pathlib import Path
from os import replace as mv

def publish(folder, staged, etag, published):
    shutil.copyfile(published[etag], folder.blob_path(etag))
    os.replace(staged, folder.blob_path(etag))
    os.chmod(folder.root / ".hfcache-trash", 0o2775)
    with open(folder.root / "trees" / "x.json", "wb") as f:
        f.write(b"{}")
    Path(folder.root, "refs", "main").write_text("abc")
    fd = os.open(folder.root / "x", os.O_WRONLY | os.O_CREAT, 0o666)
    mv(staged, folder.root / "y")
    (folder.root / "z").open(mode="a")
    (folder.root / "tmp").replace(folder.root / "final")

class Safe:
    def publish(self, sfd, dfd, name, etag):
        os.replace(name, etag, src_dir_fd=sfd, dst_dir_fd=dfd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=dfd)
        os.fchmod(fd, 0o664)
        with open("/proc/self/status", "rb") as f:
            f.read()
        "a-b".replace("-", "/")
        os.mkdir("x", 0o777, dir_fd=dfd)
'''


def test_planted_source_is_caught():
    found = offenders_in(PLANTED)
    assert [(func, what) for func, _, what in found] == [
        ("publish", "shutil.copyfile"),
        ("publish", "os.replace"),
        ("publish", "os.chmod"),
        ("publish", "open(..., writing mode)"),
        ("publish", ".write_text()"),
        ("publish", "os.open(..., writing flags)"),
        ("publish", "os.replace"),
        ("publish", ".open(writing mode)"),
        ("publish", ".replace()"),
    ]
    assert not [f for f in found if f[0].startswith("Safe")]


def test_the_old_importer_fallback_would_fail_this_test():
    """The exact lines a member once raced the importer through (its copy and rename by path) are offenders, so they
    cannot come back unnoticed."""
    old = '''
def _publish_blobs(folder, repo, staging, published, counts):
    for etag, member in sorted(repo.blobs.items()):
        staged = staging.files[member][0]
        if staged.exists():
            os.replace(staged, folder.blob_path(etag))
        else:
            shutil.copyfile(published[etag], folder.blob_path(etag))
'''
    assert [w for _, _, w in offenders_in(old)] == ["os.replace", "shutil.copyfile"]
