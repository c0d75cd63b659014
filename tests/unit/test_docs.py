"""The docs cannot drift from the CLI: every command is in README's command list and has a docs/ page naming it and
every option its --help lists; README stays a newcomer's page (short, its links resolve, its test command is the
one CI runs, no design document the repository does not have)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from hfcache.cli import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")

#: The docs page of each command group (one page per group, as render/ groups the output).
PAGES = {
    "warm": "warm.md", "lock": "warm.md",
    "ls": "ls.md",
    "verify": "verify.md", "check": "verify.md",
    "export": "transfer.md", "import": "transfer.md", "link": "transfer.md",
    "push": "oci.md", "pull": "oci.md",
    "env": "offline.md", "exec": "offline.md", "doctor": "offline.md",
    "prune": "prune.md",
    "serve": "serve.md",
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


@pytest.mark.parametrize("name", sorted(PAGES))
def test_docs_page_names_the_command_and_every_option(name):
    page = (REPO / "docs" / PAGES[name]).read_text(encoding="utf-8")
    assert f"hfcache {name}" in page, f"docs/{PAGES[name]} never shows `hfcache {name}`"
    # The synopsis block of the command: every option --help lists appears in the page.
    missing = [opt for opt in _options(cli.commands[name]) if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])",
                                                                               page)]
    assert not missing, f"docs/{PAGES[name]} does not document {missing} of `hfcache {name} --help`"


def test_docs_name_no_option_the_command_lacks():
    """The synopsis lines (``hfcache CMD ...`` in code blocks) use only options the command has."""
    for name, page_name in sorted(PAGES.items()):
        page = (REPO / "docs" / page_name).read_text(encoding="utf-8")
        known = set(_options(cli.commands[name])) | {"--help", "-h"}
        for block in re.findall(r"```\n(.*?)```", page, re.DOTALL):
            for synopsis in re.findall(rf"^hfcache {name} (.*(?:\n {{8,}}.*)*)", block, re.MULTILINE):
                used = set(re.findall(r"(?<![\w/-])(--[a-z][a-z-]*|-[a-zA-Z])\b", synopsis))
                assert used <= known, f"docs/{page_name}: `hfcache {name}` synopsis names {used - known}"


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


def test_no_design_document_the_repository_lacks():
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        if not (REPO / "DESIGN.md").exists():
            assert "DESIGN" not in text, f"{path.name} cites DESIGN, which is not in the repository"


def test_readme_test_command_is_the_one_ci_runs():
    """README's set-up: command 1 installs and runs the main job, command 2 runs the tests; .ci/run runs command 2."""
    blocks = re.findall(r"```sh\n(.*?)```", README, re.DOTALL)
    setup = next(b for b in blocks if "# 1." in b and "# 2." in b)
    commands = [line for line in setup.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and "pip install -e '.[test]'" in commands[0] and "hfcache warm" in commands[0]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == commands[1], f".ci/run ends with {ci[-1]!r}, README's test command is {commands[1]!r}"
