"""A Hub-compatible server that misbehaves on purpose, for the adversarial tests.

It serves one small repo, ``evil/repo``, whose one file ``tokenizer.json`` is honest unless a fault says
otherwise. Standard library only (``http.server``), so a fault can do anything a broken proxy could: lie in
headers, stall, never end, loop redirects, speak invalid JSON. The request log counts what was asked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT = b'{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}\n'
COMMIT = hashlib.sha1(b"evil commit").hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


FAULTS = (
    "dotdot_path", "absolute_path", "backslash_path", "bad_hash", "size_larger", "size_smaller", "redirect_loop",
    "endless_body", "stall_mid_body", "invalid_json", "error_500", "bad_commit", "gzip_bomb", "gzip_bomb_404",
    "deep_json", "file_and_folder",
    # Mirrors without ?blobs=true metadata: the fallbacks' answers are validated too.
    "bad_tree_oid", "bad_head_etag", "head_without_size",
)
_NO_BLOBS = ("bad_tree_oid", "bad_head_etag", "head_without_size")


@functools.lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """A gzip body of ~260 KiB that inflates to 256 MiB: a repo info whose JSON is padded with spaces."""
    head = json.dumps({"id": "evil/repo", "sha": COMMIT, "siblings": []}).encode()[:-1] + b', "pad": "'
    out = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    parts = [out.compress(head)]
    block = b" " * (1 << 20)
    parts += [out.compress(block) for _ in range(256)]
    parts.append(out.compress(b'"}') + out.flush())
    return b"".join(parts)


class PeerServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 playing a hostile peer. A subclass sets its own state, then calls
    ``super().__init__()``, answers in ``_answer(handler, head)`` and may log each request in ``_record(handler)``;
    ``with Server(...) as server: server.endpoint``. ``_stop`` is set on exit (for answers that drip forever)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self.do_GET(head=True)

            def do_GET(self, head: bool = False) -> None:
                outer._record(self)
                try:
                    outer._answer(self, head)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def _record(self, h) -> None:
        """Log one request (nothing by default)."""

    def _answer(self, h, head: bool) -> None:
        raise NotImplementedError

    def __enter__(self):
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()


class HostileServer(PeerServer):
    """Run with ``with HostileServer("stall_mid_body") as server: server.endpoint``."""

    def __init__(self, fault: str) -> None:
        assert fault in FAULTS, fault
        self.fault = fault
        if fault.startswith("gzip_bomb"):
            gzip_bomb()  # built before the first request, not within the client's timeout
        self.requests: list[str] = []
        super().__init__()

    def _record(self, h) -> None:
        self.requests.append(f"{h.command} {h.path}")

    # ------------------------------------------------------------------ answers

    def _send(self, h, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _answer(self, h, head: bool) -> None:
        fault = self.fault
        path = h.path.split("?")[0]
        if fault == "error_500":
            self._send(h, 500, b'{"error": "internal"}', {"Content-Type": "application/json"}, head)
            return
        if fault in ("gzip_bomb", "gzip_bomb_404") and path.startswith("/api/"):
            status = 404 if fault == "gzip_bomb_404" else 200
            self._send(h, status, gzip_bomb(), {"Content-Type": "application/json", "Content-Encoding": "gzip",
                                                "X-Error-Code": "RepoNotFound"} if status == 404 else
                       {"Content-Type": "application/json", "Content-Encoding": "gzip"}, head)
            return
        if fault == "deep_json" and path.startswith("/api/"):
            body = b'{"id": "evil/repo", "sha": "' + COMMIT.encode() + b'", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        if path.startswith("/api/models/evil/repo/tree/"):
            if fault != "bad_tree_oid":
                self._send(h, 404, b'{"error": "not found"}', {"Content-Type": "application/json"}, head)
                return
            entries = [{"type": "file", "path": "tokenizer.json", "size": len(CONTENT), "oid": "Z" * 40}]
            self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
            return
        if path.startswith("/api/models/evil/repo"):
            name = {"dotdot_path": "../../outside.json", "absolute_path": "/etc/evil.json",
                    "backslash_path": "..\\evil.json"}.get(fault, "tokenizer.json")
            sibling = {"rfilename": name} if fault in _NO_BLOBS else \
                {"rfilename": name, "size": len(CONTENT), "blobId": git_sha1(CONTENT)}
            info = {"id": "evil/repo", "sha": "not-a-commit" if fault == "bad_commit" else COMMIT,
                    "siblings": [sibling]}
            if fault == "file_and_folder":  # a path both a file and a folder: half a snapshot would be published
                info["siblings"].append({"rfilename": "tokenizer.json/tokenizer_config.json", "size": len(CONTENT),
                                         "blobId": git_sha1(CONTENT)})
            body = b'{"id": "evil/repo", "sha": ' if fault == "invalid_json" else json.dumps(info).encode()
            self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        if path.startswith("/evil/repo/resolve/"):
            self._resolve(h, head)
            return
        self._send(h, 404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"}, head)

    def _resolve(self, h, head: bool) -> None:
        fault = self.fault
        base = {"X-Repo-Commit": COMMIT, "ETag": f'"{git_sha1(CONTENT)}"'}
        if fault == "bad_head_etag":
            base["ETag"] = '"d41d8cd98f00b204e9800998ecf8427e"'  # an md5, as some proxies send
        if fault == "head_without_size" and head:  # no Content-Length: the size is unknown
            h.send_response(200)
            for k, v in base.items():
                h.send_header(k, v)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            return
        if fault == "redirect_loop":
            self._send(h, 302, b"", {**base, "Location": h.path}, head)
            return
        if fault == "bad_hash":
            self._send(h, 200, CONTENT.replace(b"UNK", b"XXX"), base, head)
            return
        if fault == "size_larger":  # claims more bytes than it sends, then closes
            h.send_response(200)
            for k, v in {**base, "Content-Length": str(len(CONTENT) + 100), "Connection": "close"}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(CONTENT)
            h.close_connection = True
            return
        if fault == "size_smaller":  # claims fewer bytes than the file has
            self._send(h, 200, CONTENT[:-10], {**base, "Content-Length": str(len(CONTENT) - 10)}, head)
            return
        if fault == "endless_body":
            h.send_response(200)
            for k, v in {**base, "Transfer-Encoding": "chunked"}.items():
                h.send_header(k, v)
            h.end_headers()
            chunk = b"x" * 65536
            while not self._stop.is_set():
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            return
        if fault == "stall_mid_body":
            h.send_response(200)
            for k, v in {**base, "Content-Length": str(len(CONTENT))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(CONTENT[:20])
            h.wfile.flush()
            self._stop.wait(120)  # never finishes while the test runs
            return
        self._send(h, 200, CONTENT, base, head)
