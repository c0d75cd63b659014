"""The example image's application: load every tokenizer hfcache.lock pins, offline, and print its input_ids.

It does what any application does, ``AutoTokenizer.from_pretrained(<repo id>)``, with no hfcache import and no
network: the image's environment (HF_HUB_CACHE, HF_HUB_OFFLINE=1, ...) points transformers at the cache that the
builder stage warmed. One JSON line per tokenizer; exit 1 if any fails to load.

    python show_tokenizers.py [TEXT] [--lock FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib

from transformers import AutoTokenizer

DEFAULT_TEXT = "Hello world, 深度学习技术正在改变世界"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", default=DEFAULT_TEXT)
    parser.add_argument("--lock", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "hfcache.lock"))
    args = parser.parse_args()
    with open(args.lock, "rb") as f:
        repos = tomllib.load(f)["repos"]
    print(f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')} HF_HUB_CACHE={os.environ.get('HF_HUB_CACHE')}",
          flush=True)
    failed = 0
    for repo in repos:
        line = {"repo_id": repo["repo_id"], "revision": repo["revision"]}
        try:
            tokenizer = AutoTokenizer.from_pretrained(repo["repo_id"], revision=repo["revision"])
            line.update({"class": type(tokenizer).__name__, "input_ids": tokenizer(args.text)["input_ids"]})
        except Exception as exc:  # noqa: BLE001 - report every tokenizer, then fail
            failed += 1
            line["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(line, ensure_ascii=False), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
