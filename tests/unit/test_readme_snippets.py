"""README snippets cannot drift from the files they summarise.

A snippet that stands for a file of the repository (the application Dockerfile, a Kubernetes manifest, the crontab)
says which one on its first line, and this test holds it to that file:

- ``# excerpt of PATH`` (anything after PATH in parentheses is a remark): every other non-blank line of the
  snippet is a line of PATH, whitespace-normalised (leading and trailing blanks dropped, runs of blanks made one),
  so a snippet may leave lines out but never change or invent one;
- ``# file: PATH``: the snippet is the whole file, whitespace-normalised line by line.

Every ``dockerfile``, ``yaml`` and ``crontab`` block of the pages checked must carry one of these lines: those are
the languages of the files in ``examples/`` and ``docker/``, and a block in them without a marker is how the old
README's Dockerfile came to lack the endpoint argument the real one has.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/quickstart.md"]
FILE_LANGUAGES = {"dockerfile", "yaml", "crontab"}
MARKER = re.compile(r"^#\s*(excerpt of|file:)\s+(\S+)(?:\s+\(.*\))?\s*$")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _normal(line: str) -> str:
    return " ".join(line.split())


def blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a markdown ``text``: (language, body)."""
    return [(lang.lower(), body) for lang, body in BLOCK.findall(text)]


def snippet_problems(lang: str, body: str, root: Path = REPO) -> list[str]:
    """What is wrong with one snippet (language ``lang``, text ``body``) against the repository at ``root``: a list
    of reasons, empty when it matches the file it names (or names none and needs not)."""
    lines = body.splitlines()
    first = lines[0].strip() if lines else ""
    marker = MARKER.match(first)
    if not marker:
        return [f"a {lang} block without `# excerpt of PATH` or `# file: PATH`: {first[:60]!r}"] \
            if lang in FILE_LANGUAGES else []
    kind, name = marker.groups()
    path = root / name
    if not path.is_file():
        return [f"names {name}, which the repository does not have"]
    wanted = [_normal(line) for line in path.read_text(encoding="utf-8").splitlines()]
    shown = [_normal(line) for line in lines[1:]]
    if kind == "file:":
        return [] if [x for x in shown if x] == [x for x in wanted if x] else [f"is not the whole of {name}"]
    present = set(wanted)
    return [f"line not in {name}: {line!r}" for line in shown if line and line not in present]


@pytest.mark.parametrize("page", PAGES)
def test_every_snippet_matches_the_file_it_names(page):
    found = [f"{page}: {reason}" for lang, body in blocks((REPO / page).read_text(encoding="utf-8"))
             for reason in snippet_problems(lang, body)]
    assert not found, "\n".join(found)


def test_the_readme_summarises_the_dockerfile_the_manifest_and_the_crontab():
    """Not vacuous: the README's three summaries are marked, so the check above reads them."""
    named = {MARKER.match(body.splitlines()[0]).group(2) for _, body in blocks((REPO / "README.md").read_text())
             if body and MARKER.match(body.splitlines()[0])}
    assert {"examples/Dockerfile", "examples/k8s/app-emptydir.yaml", "examples/crontab"} <= named


def test_the_readme_dockerfile_passes_the_endpoint_argument():
    """The issue's drift: the README's builder stage warmed without the endpoint the real file passes."""
    dockerfile = next(body for lang, body in blocks((REPO / "README.md").read_text()) if lang == "dockerfile")
    assert "ARG HF_ENDPOINT" in dockerfile and '--endpoint "${HF_ENDPOINT}"' in dockerfile


PLANTED_FILE = "FROM base AS builder\nARG HF_ENDPOINT=https://huggingface.co\nRUN hfcache warm \\\n    --endpoint x\n"


@pytest.mark.parametrize(("lang", "body", "reason"), [
    ("dockerfile", "# excerpt of Dockerfile\nFROM base AS builder\nRUN hfcache warm --lock l\n", "line not in"),
    ("dockerfile", "FROM base AS builder\n", "without `# excerpt of PATH`"),
    ("yaml", "# excerpt of missing.yaml\na: b\n", "does not have"),
    ("dockerfile", "# file: Dockerfile\nFROM base AS builder\n", "is not the whole of"),
])
def test_the_check_finds_a_planted_drift(tmp_path, lang, body, reason):
    (tmp_path / "Dockerfile").write_text(PLANTED_FILE, encoding="utf-8")
    found = snippet_problems(lang, body, tmp_path)
    assert found and reason in found[0], found


@pytest.mark.parametrize(("lang", "body"), [
    ("dockerfile", "# excerpt of Dockerfile (remark)\nFROM  base AS builder\n\n  RUN hfcache warm \\\n--endpoint x\n"),
    ("dockerfile", "# file: Dockerfile\n" + PLANTED_FILE),
    ("sh", "hfcache warm bert-base-uncased\n"),  # a command, not a file: nothing to compare
])
def test_the_check_accepts_a_faithful_snippet(tmp_path, lang, body):
    (tmp_path / "Dockerfile").write_text(PLANTED_FILE, encoding="utf-8")
    assert snippet_problems(lang, body, tmp_path) == []


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_try_it_here_runs_as_written(tmp_path):
    """README's "Try it here" recipe, run by bash at the repository root: `hfcache serve --repos` (the product, not
    the tests' server), a warm from it, the server stopped, then an offline load. Only the port (8080 may be
    taken), the cache folder and the venv's location are substituted."""
    import shutil
    import subprocess
    import sys

    from tests.helpers import clean_env

    if shutil.which("curl") is None:
        pytest.fail("curl is needed by the recipe (CI installs it)")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Try it here", 1)[1].split("\n## ", 1)[0]
    recipe = next(body for lang, body in blocks(section) if lang == "sh")
    assert "hfcache serve --repos tests/data/hub" in recipe and "python -m hfcache.serve" not in recipe
    port = str(_free_port())
    script = (recipe.replace("8080", port).replace("/tmp/hf-demo", str(tmp_path / "hf-demo"))
              .replace(".venv/bin/", str(Path(sys.executable).parent) + "/"))
    try:
        proc = subprocess.run(["bash", "-e", "-m", "-c", script], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=clean_env())
    finally:
        shutil.rmtree(tmp_path / "hf-demo", ignore_errors=True)  # 5.5 MiB: the suite leaves no caches behind
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 ok, 0 failed;" in proc.stdout + proc.stderr
    assert "bert-base-uncased" in proc.stdout and "'input_ids': [101, 7592, 2088, 102]" in proc.stdout
