"""The child side of ``hfcache check``: load tokenizers offline and report, one JSON line on stdout.

Run as ``python -m hfcache.probe TEXT REPO_ID@REVISION...`` with ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` set by
the parent. Before transformers is imported, an audit hook (PEP 578, ``sys.addaudithook``) turns any attempt to
open a network connection into an immediate error, so a load that would reach for the network fails fast and says
so instead of hanging (DESIGN §3).
"""

from __future__ import annotations

import json
import socket
import sys
import time


class NetworkAttempt(RuntimeError):
    """Raised inside the child when code tries to connect anywhere."""


#: Connection attempts seen by the guard; libraries may swallow the exception, so they are also recorded here.
ATTEMPTS: list[str] = []


def _guard(event: str, args: tuple) -> None:
    if event == "socket.connect":
        sock, address = args[0], args[1]
        if getattr(sock, "family", None) == getattr(socket, "AF_UNIX", object()):
            return
        ATTEMPTS.append(repr(address))
        raise NetworkAttempt(f"hfcache check: network access attempted ({address!r}) during an offline load")


def probe(text: str, specs: list[str]) -> dict[str, dict]:
    """Load each ``REPO_ID@REVISION`` with ``AutoTokenizer.from_pretrained`` and encode ``text``."""
    results: dict[str, dict] = {}
    started = time.perf_counter()
    try:
        from transformers import AutoTokenizer
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return {spec: {"error": f"{type(exc).__name__}: {exc}"} for spec in specs}
    import_seconds = time.perf_counter() - started
    for spec in specs:
        repo_id, _, revision = spec.partition("@")
        t0 = time.perf_counter()
        ATTEMPTS.clear()
        try:
            tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision or "main")
            ids = tokenizer(text)["input_ids"]
            if ATTEMPTS:  # it loaded, but only because the library swallowed the refused connection
                raise NetworkAttempt(f"network access attempted ({ATTEMPTS[0]}) during an offline load")
            results[spec] = {
                "class": type(tokenizer).__name__,
                "vocab_size": len(tokenizer),
                "input_ids": ids,
                "seconds": round(time.perf_counter() - t0, 4),
            }
        except Exception as exc:  # noqa: BLE001 - every failure is data for the parent's diagnosis
            error = f"{type(exc).__name__}: {exc}"
            if ATTEMPTS and not isinstance(exc, NetworkAttempt):
                error = f"network access attempted ({ATTEMPTS[0]}) during an offline load; then {error}"
            results[spec] = {"error": error, "seconds": round(time.perf_counter() - t0, 4)}
    results["__import_seconds__"] = {"seconds": round(import_seconds, 4)}
    return results


def main() -> None:
    sys.addaudithook(_guard)
    text, specs = sys.argv[1], sys.argv[2:]
    sys.stdout.write(json.dumps(probe(text, specs)) + "\n")


if __name__ == "__main__":
    main()
