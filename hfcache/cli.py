"""The ``hfcache`` command: parse arguments, call one core function, render, exit.

Exit codes (README "Exit codes"): 0 ok; 1 a check failed; 2 usage or bad input; 3 Hub or network;
4 offline violation; 5 cache or filesystem; 70 internal error (a bug: please report it); 130 interrupted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import __version__
from .errors import HfcacheError, UsageError

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def _read_token(token: str | None, token_file: str | None) -> str | bool | None:
    """The token to send: --token, else --token-file, else None (huggingface_hub's own lookup: HF_TOKEN, file)."""
    if token and token_file:
        raise UsageError("--token and --token-file are mutually exclusive", hint="give one of them")
    if token_file:
        try:
            value = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
        if not value:
            raise UsageError(f"--token-file {token_file} is empty")
        return value
    return token or None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hfcache")
def cli() -> None:
    """Provision Hugging Face tokenizer and model caches for images, volumes and clusters."""


@cli.command()
@click.argument("repos", nargs=-1, required=True, metavar="REPO_ID[@REVISION]...")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache root [default: HF_HUB_CACHE, "
              "$HF_HOME/hub or ~/.cache/huggingface/hub].")
@click.option("--endpoint", metavar="URL", help="Hub endpoint [default: HF_ENDPOINT or https://huggingface.co].")
@click.option("--token", metavar="TOKEN", help="Hub token (visible in `ps`; prefer --token-file or HF_TOKEN).")
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the Hub token.")
@click.option("--kind", type=click.Choice(["tokenizer", "model", "all"]), default="tokenizer", show_default=True,
              help="tokenizer: tokenizer files + config.json; model: + configs and weights in one format; "
                   "all: the whole repo.")
@click.option("--include", multiple=True, metavar="GLOB", help="Also fetch files matching GLOB (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Never fetch files matching GLOB (repeatable).")
@click.option("--repo-type", type=click.Choice(["model", "dataset"]), default="model", show_default=True)
@click.option("--max-workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="Parallel downloads.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds to wait for a connection or for any byte of an answer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; no progress.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary; errors only.")
def warm(repos, cache_dir, endpoint, token, token_file, kind, include, exclude, repo_type, max_workers, timeout,
         as_json, quiet) -> None:
    """Download tokenizers (or models) into a cache that transformers loads offline.

    Every file is hashed against what the endpoint publishes before it becomes visible; the result is
    huggingface_hub's own cache layout, with .no_exist markers for optional files a repo lacks.

    \b
    Examples:
      hfcache warm bert-base-uncased
      hfcache warm openai-community/gpt2@main FacebookAI/roberta-base --cache-dir /opt/hf-cache
    """
    from . import output
    from .records import WarmRequest
    from .warm import warm as warm_repos

    requests = [
        WarmRequest.parse(spec, repo_type=repo_type, kind=kind, include=tuple(include), exclude=tuple(exclude))
        for spec in repos
    ]
    resolved_token = _read_token(token, token_file)
    with output.WarmProgress(len(requests), enabled=not (as_json or quiet)) as progress:
        report = warm_repos(requests, cache_dir=cache_dir, endpoint=endpoint, token=resolved_token,
                            max_workers=max_workers, timeout=timeout, progress=progress)
    if as_json:
        output.print_json(output.warm_report_dict(report))
    else:
        if not quiet:
            output.stderr.print(output.warm_summary_table(report))
        for r in report.repos:
            if not r.ok:
                output.print_error(r.error or "failed", r.hint)
    sys.exit(report.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and map every hfcache error to its exit code, without traceback."""
    debug = os.environ.get("HFCACHE_DEBUG") not in (None, "", "0")
    try:
        cli.main(args=argv, prog_name="hfcache", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except HfcacheError as exc:
        if debug:
            raise
        from .output import print_error

        print_error(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors are turned into an exit code
        if debug:
            raise
        from .output import print_error

        print_error(f"internal error: {type(exc).__name__}: {exc}",
                    "rerun with HFCACHE_DEBUG=1 for the traceback and report it")
        sys.exit(EXIT_INTERNAL)
