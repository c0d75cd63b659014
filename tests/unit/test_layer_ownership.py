"""Each idea written once, read with ast (nothing is imported): the filesystem layer alone spells ``O_NOFOLLOW``,
``hfcache/cache/content.py`` alone hashes git blobs (sha1), ``hfcache/names.py`` alone defines the 40/64-hex
patterns (docs/architecture.md, "The names, content and filesystem layer").

A module that needs one of these asks the layer (``cache.fsops``/``cache.safefs`` for opens that follow no link,
``cache.content`` for hashing a blob as the Hub names it, ``names`` for validating an etag, commit or digest), so
the rule that keeps a member's planted link from being followed, or a blob from being hashed the wrong way, is in
one place and cannot drift.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hfcache"

#: The filesystem layer: the only modules that open below a cache root with their own flags.
FS_LAYER = {"hfcache.cache.fsops", "hfcache.cache.safefs", "hfcache.cache.safefs_tree", "hfcache.cache.shared_store",
            "hfcache.cache.atomic", "hfcache.cache.locking", "hfcache.cache.incomplete", "hfcache.cache.layout"}
#: Outside the layer, at most two modules may spell O_NOFOLLOW, each with its reason.
NOFOLLOW_ELSEWHERE: dict[str, str] = {}
#: The one place git's blob sha1 (``hashlib.sha1``) is computed.
SHA1_OWNERS = {"hfcache.cache.content"}
#: The one place 40/64-hex patterns are defined.
HEX_OWNERS = {"hfcache.names"}
_HEX_PATTERN = re.compile(r"\{(40|64)\}")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _uses(source: str) -> tuple[bool, bool, bool]:
    """(spells O_NOFOLLOW, calls hashlib.sha1 / sha1(...), holds a 40/64-hex pattern string)."""
    nofollow = sha1 = hexpat = False
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "O_NOFOLLOW" or isinstance(node, ast.Constant) and node.value == "O_NOFOLLOW":
            nofollow = True
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "sha1" or (name == "new" and node.args and isinstance(node.args[0], ast.Constant)
                                  and node.args[0].value == "sha1"):
                sha1 = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if "0-9a-f" in text and _HEX_PATTERN.search(text):
                hexpat = True
    return nofollow, sha1, hexpat


USES = {_module_name(p): _uses(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}


def test_only_the_filesystem_layer_spells_o_nofollow():
    outside = sorted(m for m, (nofollow, _, _) in USES.items() if nofollow and m not in FS_LAYER)
    assert set(outside) <= set(NOFOLLOW_ELSEWHERE), \
        "open through hfcache.cache.fsops / safefs instead of os.open(..., O_NOFOLLOW):\n  " + \
        "\n  ".join(m for m in outside if m not in NOFOLLOW_ELSEWHERE)
    assert len(NOFOLLOW_ELSEWHERE) <= 2


def test_only_content_hashes_git_blobs():
    others = sorted(m for m, (_, sha1, _) in USES.items() if sha1 and m not in SHA1_OWNERS)
    assert not others, "hash through hfcache.cache.content (BlobHash, hash_fd, git_blob_sha1): " + ", ".join(others)


def test_only_names_defines_hex_patterns():
    others = sorted(m for m, (_, _, hexpat) in USES.items() if hexpat and m not in HEX_OWNERS)
    assert not others, "validate with hfcache.names (is_commit, is_sha256, is_etag, is_oci_digest): " + \
        ", ".join(others)


def test_the_checks_can_fail():
    planted = '''
import hashlib, os, re
COMMIT = re.compile(r"[0-9a-f]{40}")
def f(dfd):
    os.open("x", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    return hashlib.sha1(b"blob 0\\0")
'''
    assert _uses(planted) == (True, True, True)
    assert _uses("import os\nos.open('x', os.O_RDONLY)\n") == (False, False, False)
