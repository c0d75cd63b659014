"""The ``hfcache`` command: the Click group (``cli``) and the entry points (``run``, ``main``) that map every error to
its exit code (docs/cli.md "Exit codes"; 70: an internal error, 143: SIGTERM)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from typing import NoReturn

import click

from .._version import __version__
from ..errors import CacheError, HfcacheError, UsageError
from .ls import ls_command
from .move import export_command, import_command, link_command
from .oci import pull_command, push_command
from .offline import doctor_command, env_command, exec_cmd, path_command
from .prune import prune
from .render.common import print_error, print_json, usage_hint
from .serve import serve
from .sign import sign_command
from .stdout import GuardedStdout, abandon_if_blocked
from .sync import sync_command
from .verify import check, verify
from .warm import lock, warm

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process killed by SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (``docker stop``, the kubelet) arrived: handled exactly like Ctrl-C, exit 143."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hfcache")
def cli() -> None:
    """Provision Hugging Face tokenizer and model caches for images, volumes and clusters."""


for _command in (warm, lock, ls_command, verify, check, export_command, import_command, link_command, prune, serve,
                 env_command, exec_cmd, doctor_command, push_command, pull_command, path_command, sign_command, sync_command):
    cli.add_command(_command)


def _fail(message: str, hint: str | None, exit_code: int, as_json: bool) -> None:
    """Report a command-level error: one or two lines on stderr, and with --json also one JSON document."""
    print_error(message, hint)
    if as_json and not getattr(sys.stdout, "started", False):  # never a second document after a begun one
        print_json({"ok": False, "error": message, "hint": hint, "exit_code": exit_code})
    sys.exit(exit_code)


def _command_path(args: list[str]) -> str:
    name = next((a for a in args if not a.startswith("-")), None)
    return f"hfcache {name}" if name in cli.commands else "hfcache"


def _interrupted(code: int, as_json: bool) -> None:
    """Ctrl-C (exit 130) or SIGTERM (exit 143): the error line (and the --json document), then exit at once."""
    message = "terminated" if code == EXIT_TERMINATED else "interrupted"
    hint = "run the command again; what was interrupted was not published (partial downloads resume)"
    abandoned = abandon_if_blocked(sys.stdout)  # a reader that does not read must not hold the exit up
    with contextlib.suppress(BaseException):  # an output that fails now (a reader gone) changes nothing
        print_error(message, hint)
        if as_json and not abandoned:
            print_json({"ok": False, "error": message, "hint": hint, "exit_code": code})
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Flush and exit at once: a download thread blocked on a silent socket must not hold the exit up."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # cli/stdout.py ends a failed write with SystemExit
            stream.flush()
    os._exit(code)


def run() -> NoReturn:
    """The ``hfcache`` program (console script, ``python -m hfcache``): :func:`main`, then non-daemon threads joined,
    atexit handlers run, the output flushed, and an exit without the module teardown (~27 ms: docs/benchmarks.md)."""
    sys.stdout = GuardedStdout(sys.stdout)  # a failed write of the output: exit 141 or 5, no traceback
    code: object = 0
    try:
        main()
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    if not isinstance(code, int):  # sys.exit("message"), as the interpreter prints it
        sys.stderr.write(f"{code}\n")
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # CPython's private call (library gap: no public way before os._exit, bpo-17186)
    try:
        sys.stdout.flush()  # the output's last buffered bytes: their failure is the command's
    except SystemExit as exc:
        code = exc.code
    _exit_now(code)



def main(argv: list[str] | None = None) -> None:
    """In-process entry point: run the CLI and map every error to its exit code, without traceback."""
    args = sys.argv[1:] if argv is None else argv
    head = args[:args.index("--")] if "--" in args else args
    as_json = "--json" in head and head[:1] != ["exec"]  # exec has no --json: its COMMAND's arguments are not ours
    debug = os.environ.get("HFCACHE_DEBUG") not in (None, "", "0")
    signal.signal(signal.SIGTERM, _on_sigterm)  # `serve` installs its own graceful handler; `exec` replaces us
    try:
        cli.main(args=args, prog_name="hfcache", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # `hfcache` alone: the help a newcomer asked for, not an error
        sys.stdout.write(exc.format_message() + "\n")
        sys.exit(0)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else _command_path(args)
        _fail(exc.format_message(), f"see `{command} --help`", UsageError.exit_code, as_json)
    except click.ClickException as exc:
        _fail(exc.format_message(), usage_hint(exc.exit_code, _command_path(args)), exc.exit_code, as_json)
    except click.Abort as exc:  # click turns KeyboardInterrupt (and so Terminated) into Abort
        _interrupted(EXIT_TERMINATED if isinstance(exc.__cause__, Terminated) else EXIT_INTERRUPTED, as_json)
    except Terminated:
        _interrupted(EXIT_TERMINATED, as_json)
    except HfcacheError as exc:
        if debug:
            raise
        _fail(exc.message, usage_hint(exc.exit_code, _command_path(args), exc.hint), exc.exit_code, as_json)
    except KeyboardInterrupt:
        _interrupted(EXIT_INTERRUPTED, as_json)
    except PermissionError as exc:
        # A part of a cache (or a file given) this user cannot read or write, in a path no command anticipated: a
        # filesystem problem (exit 5) naming the path, never an internal error.
        if debug:
            raise
        _fail(f"{exc.filename or 'a file'}: permission denied for uid {os.geteuid()}",
              "check its permissions (`hfcache doctor` shows what this user can read and write in a cache)",
              CacheError.exit_code, as_json)
    except Exception as exc:  # the one place unexpected errors are turned into an exit code
        if debug:
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc}",
              "rerun with HFCACHE_DEBUG=1 for the traceback and report it", EXIT_INTERNAL, as_json)
