"""The docs cannot drift from the CLI: every command is in README's command list and has a docs/ page naming it and
every option its --help lists; README stays a newcomer's page (short, its links resolve, its test command is the
one CI runs, no design document the repository does not have)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from hfcache.cli.main import cli
from tests.helpers import source_files

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")

#: The docs page of each command group (one page per group, as cli/render/ groups the output).
PAGES = {
    "warm": "warm.md", "lock": "warm.md",
    "ls": "ls.md",
    "verify": "verify.md", "check": "verify.md",
    "export": "transfer.md", "import": "transfer.md", "link": "transfer.md",
    "push": "oci.md", "pull": "oci.md",
    "env": "offline.md", "exec": "offline.md", "doctor": "offline.md",
    "prune": "prune.md",
    "serve": "serve.md",
    "path": "runtimes.md",
    "sign": "oci.md",
    "sync": "fleet.md",
}


def test_every_command_has_a_page():
    assert sorted(cli.commands) == sorted(PAGES)


def _options(command: click.Command) -> list[str]:
    """The long and short option names `hfcache COMMAND --help` lists."""
    names = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names += [name for name in param.opts + param.secondary_opts]
    return names


def _synopsis(name: str) -> str:
    """The synopsis lines of `hfcache NAME` on its page: lines of plain code blocks starting with it, with their
    indented continuation lines."""
    page = (REPO / "docs" / PAGES[name]).read_text(encoding="utf-8")
    blocks = [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", page, re.DOTALL | re.MULTILINE) if not lang]
    lines = [synopsis for block in blocks
             for synopsis in re.findall(rf"^hfcache {name}\b(.*(?:\n {{8,}}.*)*)", block, re.MULTILINE)]
    assert lines, f"docs/{PAGES[name]} has no synopsis block for `hfcache {name}`"
    return "\n".join(lines)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_synopsis_lists_every_option_of_help(name):
    """Every option `hfcache NAME --help` lists is in the synopsis on its docs page (and explained around it)."""
    synopsis = _synopsis(name)
    missing = [opt for opt in _options(cli.commands[name])
               if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", synopsis)]
    assert not missing, f"docs/{PAGES[name]}: the `hfcache {name}` synopsis lacks {missing} of its --help"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_synopsis_names_no_option_the_command_lacks(name):
    known = set(_options(cli.commands[name])) | {"--help", "-h"}
    used = set(re.findall(r"(?<![\w/-])(--[a-z][a-z-]*|-[a-zA-Z])\b", _synopsis(name)))
    assert used <= known, f"docs/{PAGES[name]}: the `hfcache {name}` synopsis names {used - known}, not options"


def test_readme_lists_every_command_with_its_page():
    for name, page in PAGES.items():
        assert re.search(rf"^\| `hfcache {name}` \|.*\(docs/{re.escape(page)}\)", README, re.MULTILINE), \
            f"README's command list has no row for `hfcache {name}` linking docs/{page}"


def test_readme_is_short_and_its_links_resolve():
    assert len(README.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links to {target}, which the repository does not have"
    for page in (REPO / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"docs/{page.name} links to {target}: missing"


#: Citations a reader of the repository cannot follow: a design note that is not in it, an issue tracker's numbers.
#: (Upstream references such as ``huggingface/transformers#47852`` or ``PR #4498`` name a public source.)
UNFOLLOWABLE = re.compile(r"\bDESIGN\b|\u00a7|\b[Ii]ssues? \d+")


def test_every_citation_resolves_inside_the_repository_or_upstream():
    paths = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "benchmarks").iterdir(),
             *(REPO / "hfcache").rglob("*.py"), *(REPO / "tests").glob("*.py"), *(REPO / "tests" / "unit").glob("*.py"),
             *(REPO / "tests" / "integration").glob("*.py"), *source_files(REPO / "examples"), *(REPO / "docker").iterdir()]
    found = []
    for path in sorted(p for p in paths if p.is_file() and p != Path(__file__).resolve()):
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if UNFOLLOWABLE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not found, "citations a reader cannot follow:\n" + "\n".join(found)


def test_the_citation_check_finds_a_planted_one():
    assert UNFOLLOWABLE.search("see DESIGN \u00a72") and UNFOLLOWABLE.search("(issue 18, P3)")
    assert not UNFOLLOWABLE.search("huggingface/transformers#47852, PR #4498, docs/cache-layout.md")


def test_readme_test_command_is_the_one_ci_runs():
    """README's set-up: command 1 installs and runs the main job, command 2 runs the tests; .ci/run runs command 2."""
    blocks = re.findall(r"```sh\n(.*?)```", README, re.DOTALL)
    setup = next(b for b in blocks if "# 1." in b and "# 2." in b)
    commands = [line for line in setup.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and "pip install -e '.[test]'" in commands[0] and "hfcache warm" in commands[0]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == commands[1], f".ci/run ends with {ci[-1]!r}, README's test command is {commands[1]!r}"
