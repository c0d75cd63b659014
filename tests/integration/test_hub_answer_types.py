"""Every field of a Hub answer is type-checked where it enters (docs/security.md): an endpoint or an upstream that
answers a list, an object, a number, null, a bool, a float, a huge integer or deep nesting where the protocol has
another type gets a one-line hfcache error with exit 3 (or 2: an empty selection), never exit 70 or a traceback.

A small Hub (:class:`TypedHub`, on tests/hostile.py's ``PeerServer``) serves ``org/x`` with mutated answers; each case runs
the real command (``warm``, ``lock``, and the mirror of ``hfcache serve --upstream``) against it. The mutations are
every path of the repo info, of a tree page, of the error bodies, of the configs warm reads, times every substitute
of tests/mutations.py: a few hundred cases, deterministic, in-process (a few as subprocesses).

What escaped before (exit 70): an error answer whose body is JSON but not an object (``[1]``, ``"x"``, ``5``,
``null``: huggingface_hub's ``hf_raise_for_status`` calls ``.get`` on it), on repo info and tree pages, any status;
a size beyond a float (``10**400``: OverflowError in the download's part arithmetic). Sizes of 2**64 went as far as the
download before failing; values were quoted whole (a 5,000-character line).
"""

from __future__ import annotations

import hashlib
import json

import httpx2
import pytest

from hfcache.serve.pullthrough import PullThroughConfig
from tests.helpers import clean_env, run_hfcache
from tests.hostile import PeerServer, git_sha1
from tests.mutations import JSON_VALUES, label, mutations, problems, run_cli
from tests.testhub import HubServer

REPO = "org/x"
C = hashlib.sha1(b"typed commit").hexdigest()  # a commit id
TOKENIZER = b'{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}\n'
SHA256 = hashlib.sha256(TOKENIZER).hexdigest()
INFO = {"id": REPO, "sha": C, "siblings": [{"rfilename": "tokenizer.json", "size": len(TOKENIZER),
                                            "blobId": git_sha1(TOKENIZER),
                                            "lfs": {"sha256": SHA256, "size": len(TOKENIZER)}}]}
NAMES_ONLY = {"id": REPO, "sha": C, "siblings": [{"rfilename": "tokenizer.json"}]}  # the tree API is asked next
TREE = [{"type": "file", "path": "tokenizer.json", "size": len(TOKENIZER), "oid": git_sha1(TOKENIZER),
         "lfs": {"oid": SHA256, "size": len(TOKENIZER)}}]
#: Error bodies of every JSON type and shape huggingface_hub's message reader meets (and non-JSON ones).
ERROR_BODIES = (b"[1]", b'"x"', b"5", b"null", b'{"error": [1, {"a": 2}]}', b'{"error": {"a": 1}}',
                b'{"error": "e", "errors": 5}', b'{"errors": [5, "message", {"message": 7}]}',
                b'{"error_description": []}', b"\xff\xfe{", b"[" * 100_000, b"<html>" + b"x" * 70_000)


class TypedHub(PeerServer):
    """``org/x`` at ``C``: ``info`` (repo info), ``tree`` (a tree page; None: no tree API, 404), ``files`` (path ->
    bytes, with their git sha1 as ETag); ``error`` = (route, status, body) answers that route with that error
    (routes: ``info``, ``tree``, ``file``); ``head`` = the headers of every ``HEAD`` of a file (the fallback when
    neither repo info nor a tree lists sizes and hashes). The test Hub answers from the files it serves, never with a
    field of the wrong type."""

    def __init__(self) -> None:
        self.info: bytes = json.dumps(INFO).encode()
        self.tree: bytes | None = None
        self.files = {"tokenizer.json": TOKENIZER}
        self.error: tuple[str, int, bytes] | None = None
        self.head: dict[str, str] | None = None
        super().__init__()
        self.handle_error = lambda request, address: None  # a client gone mid-answer: not our stderr
        # Headers and body are two writes: without TCP_NODELAY each answer waits ~40 ms for a delayed ACK.
        self.RequestHandlerClass.disable_nagle_algorithm = True

    def _send(self, h, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        h.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            h.send_header(key, value)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _answer(self, h, head: bool) -> None:
        path = h.path.split("?")[0]
        route = ("info" if path.startswith(f"/api/models/{REPO}/revision/") else
                 "tree" if path.startswith(f"/api/models/{REPO}/tree/") else
                 "file" if path.startswith(f"/{REPO}/resolve/") else None)
        if head and route == "file" and self.head is not None:
            self._send(h, 200, b"", {"X-Repo-Commit": C, **self.head}, head)
        elif self.error is not None and self.error[0] == route:
            self._send(h, self.error[1], self.error[2], {"Content-Type": "application/json"}, head)
        elif route == "info":
            self._send(h, 200, self.info, {"Content-Type": "application/json"}, head)
        elif route == "tree" and self.tree is not None:
            self._send(h, 200, self.tree, {"Content-Type": "application/json"}, head)
        elif route == "file" and path.split("/", 5)[-1] in self.files:
            body = self.files[path.split("/", 5)[-1]]
            self._send(h, 200, body, {"X-Repo-Commit": C, "ETag": f'"{git_sha1(body)}"'}, head)
        else:
            self._send(h, 404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, head)


@pytest.fixture(scope="module")
def hub():
    with TypedHub() as server:
        yield server


def _warm(hub: TypedHub, cache, *extra: str) -> tuple[int, str, str]:
    return run_cli(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint, "--retries", "0",
                    "--timeout", "10", *extra])


def _check(cases, allowed=(0, 2, 3)) -> None:
    found = []
    for case, (code, _, stderr) in cases:
        found += problems(case, code, stderr, allowed)
    assert not found, "\n".join(found[:20]) + f"\n({len(found)} problems in {len(cases)} cases)"


def test_repo_info_fields_of_every_type(hub, tmp_path):
    """Repo info (``?blobs=true``): every field and the answer itself (~140 cases)."""
    cases = []
    for i, (path, value, info) in enumerate(mutations(INFO)):
        hub.info, hub.tree, hub.error = json.dumps(info).encode(), None, None
        cases.append((f"info {label(path, value)}", _warm(hub, tmp_path / f"c{i}")))
    for value in JSON_VALUES[:-1]:  # the whole answer replaced
        hub.info = json.dumps(value).encode()
        cases.append((f"info ={label((), value)}", _warm(hub, tmp_path / "whole")))
    hub.info = json.dumps(INFO).encode()
    assert len(cases) > 120
    _check(cases)


def test_tree_page_fields_of_every_type(hub, tmp_path):
    """A tree page (repo info lists names only): every field of an entry and the page (~100 cases)."""
    cases = []
    hub.info, hub.error = json.dumps(NAMES_ONLY).encode(), None
    try:
        for i, (path, value, tree) in enumerate(mutations(TREE)):
            hub.tree = json.dumps(tree).encode()
            cases.append((f"tree {label(path, value)}", _warm(hub, tmp_path / f"c{i}")))
        for value in JSON_VALUES[:-1]:
            hub.tree = json.dumps(value).encode()
            cases.append((f"tree ={label((), value)}", _warm(hub, tmp_path / "whole")))
    finally:
        hub.info, hub.tree = json.dumps(INFO).encode(), None
    assert len(cases) > 100
    _check(cases)


def test_error_bodies_of_every_type(hub, tmp_path):
    """An error answer (400, 401, 404, 500) on repo info, a tree page and a file: its body of every JSON type is
    read for its message, and the status keeps its meaning (401: exit 3 naming it). 144 cases."""
    cases = []
    for route in ("info", "tree", "file"):
        for status in (400, 401, 404, 500):
            for body in ERROR_BODIES:
                hub.info = json.dumps(NAMES_ONLY if route == "tree" else INFO).encode()
                hub.tree = json.dumps(TREE).encode() if route == "tree" else None
                hub.error = (route, status, body)
                cases.append((f"{route} {status} {body[:20]!r}", _warm(hub, tmp_path / f"{route}{status}")))
    hub.info, hub.tree, hub.error = json.dumps(INFO).encode(), None, None
    _check(cases)
    unauthorized = [result for case, result in cases if case.startswith("info 401")]
    assert all(code == 3 and "HTTP 401" in err and "not authorized" in err for code, _, err in unauthorized), \
        unauthorized[:2]


def test_configs_warm_reads_of_every_type(hub, tmp_path):
    """``tokenizer_config.json``'s ``auto_map`` and ``modules.json``, which warm parses to follow custom code and
    sentence-transformers modules: every field of each (fetched and hash-checked first, so valid answers)."""
    configs = {"tokenizer_config.json": {"auto_map": {"AutoTokenizer": ["tok.Slow", "tok.Fast"]}},
               "modules.json": [{"path": "m"}]}
    cases = []
    try:
        for name, base in configs.items():
            for i, (path, value, doc) in enumerate(mutations(base)):
                body = json.dumps(doc).encode()
                hub.files = {"tokenizer.json": TOKENIZER, name: body}
                hub.info = json.dumps({"id": REPO, "sha": C, "siblings": [
                    {"rfilename": n, "size": len(b), "blobId": git_sha1(b)} for n, b in hub.files.items()]}).encode()
                cases.append((f"{name} {label(path, value)}",
                               _warm(hub, tmp_path / f"{name}{i}", "--kind", "model")))
    finally:
        hub.files, hub.info = {"tokenizer.json": TOKENIZER}, json.dumps(INFO).encode()
    _check(cases)


@pytest.mark.parametrize("headers", [
    {"X-Linked-Size": "abc"}, {"X-Linked-Size": "-1"}, {"X-Linked-Size": "1e3"}, {"X-Linked-Size": "9" * 5000},
    {"X-Linked-Size": str(10**30)}, {"X-Linked-Size": "96", "ETag": '"' + "x" * 5000 + '"'},
    {"X-Linked-Size": "96", "ETag": 'W/"abc"'}, {"X-Linked-Size": "96", "ETag": '""'}, {"X-Linked-Size": "96"},
], ids=lambda headers: "-".join(f"{k}={v[:12]}" for k, v in headers.items()))
def test_head_answers_of_every_shape(hub, tmp_path, headers):
    """The ``HEAD`` fallback (names-only repo info, no tree API): sizes and ETags that are no number or no hash
    end in exit 3 naming the file, on one line."""
    hub.info, hub.tree, hub.error, hub.head = json.dumps(NAMES_ONLY).encode(), None, None, headers
    try:
        code, _, err = _warm(hub, tmp_path / "cache")
    finally:
        hub.info, hub.head = json.dumps(INFO).encode(), None
    assert not problems("HEAD", code, err, (3,)), err
    assert "tokenizer.json" in err, err


def test_sizes_past_a_float_are_refused_naming_the_file(hub, tmp_path):
    """10**400 was exit 70 (OverflowError splitting the download into parts); 2**64 and 2**53 are refused before
    any download, exit 3 naming the file and quoting the value on one line."""
    for size in (10**400, 2**64, 2**53):
        info = json.loads(json.dumps(INFO))
        info["siblings"][0]["size"] = size
        hub.info = json.dumps(info).encode()
        code, _, err = _warm(hub, tmp_path / str(size)[:8])
        assert code == 3, err
        assert "gave no valid size for tokenizer.json" in err and len(err.splitlines()[0]) < 400, err
    hub.info = json.dumps(INFO).encode()
    code, _, err = _warm(hub, tmp_path / "honest")
    assert code == 0, err


def test_lock_and_the_mirror_read_the_same_answers_typed(hub, tmp_path):
    """``lock`` (pin) and ``serve --upstream`` (pull-through) read upstream answers through the same code: a sample
    of the mutations (every substitute at the sibling's size and blob id, error bodies) ends in exit 2/3 for
    ``lock`` and in a mapped HTTP error (never 500) from the mirror."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "hfcache.toml").write_text(f'endpoint = "{hub.endpoint}"\n[[repos]]\nrepo_id = "{REPO}"\n')
    samples = [(label(p, v), json.dumps(doc).encode(), None) for p, v, doc in mutations(INFO)
               if p in (("siblings", 0, "size"), ("siblings", 0, "blobId"), ("sha",))]
    samples += [(f"info 404 {body[:20]!r}", json.dumps(INFO).encode(), ("info", 404, body)) for body in ERROR_BODIES]
    cases, answers = [], []
    root = tmp_path / "mirror"
    root.mkdir()
    with HubServer(root, layout="cache", lfs_redirect=False,
                   upstream=PullThroughConfig(upstreams=(hub.endpoint,), timeout=10, revalidate=0)) as mirror:
        for case, info, error in samples:
            hub.info, hub.tree, hub.error = info, None, error
            cases.append((f"lock {case}", run_cli(["lock", "--manifest", str(project / "hfcache.toml"),
                                                   "--retries", "0"])))
            answer = httpx2.get(f"{mirror.endpoint}/api/models/{REPO}/revision/main", timeout=60)
            answers.append((case, answer.status_code, answer.text[:200]))
    hub.info, hub.error = json.dumps(INFO).encode(), None
    _check(cases)
    assert not [a for a in answers if a[1] == 500 or a[1] not in (200, 403, 404, 502, 503)], answers


@pytest.mark.parametrize("error", [("info", 404, b"[1]"), ("tree", 500, b"null")])
def test_an_error_body_that_is_no_object_as_a_subprocess(hub, tmp_path, error):
    """Two of the cases that were exit 70, through ``python -m hfcache`` itself."""
    hub.info = json.dumps(NAMES_ONLY if error[0] == "tree" else INFO).encode()
    hub.tree, hub.error = json.dumps(TREE).encode(), error
    try:
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(tmp_path / "cache"), "--endpoint", hub.endpoint,
                            "--retries", "0"], env=clean_env())
    finally:
        hub.info, hub.tree, hub.error = json.dumps(INFO).encode(), None, None
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert f"HTTP {error[1]}" in proc.stderr or "not found" in proc.stderr, proc.stderr
