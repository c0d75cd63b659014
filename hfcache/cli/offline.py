"""``hfcache env``, ``exec``, ``doctor`` and ``path``: parse, call :mod:`hfcache.offline`, render."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError
from .options import cache_dir_option, json_option


@click.command(name="env")
@cache_dir_option()
@click.option("--format", "fmt", type=click.Choice(["sh", "dotenv", "dockerfile", "k8s", "json"]), default="sh",
              show_default=True, help="sh: export lines; dotenv: NAME=value; dockerfile: one ENV instruction; "
              "k8s: a container env: list; json: one object.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (same as --format json).")
def env_command(cache_dir, fmt, as_json) -> None:
    """Print the variables that make a process use only the cache (offline, no telemetry, no token lookups).

    \b
    Examples:
      eval "$(hfcache env --cache-dir /opt/hf-cache)"
      hfcache env --cache-dir /opt/hf-cache --format dockerfile >> Dockerfile
      hfcache env --cache-dir /opt/hf-cache --format k8s
    """
    from ..offline.env import format_env, offline_environment
    from .render import offline as render

    render.show_env(format_env(offline_environment(cache_dir), "json" if as_json else fmt))


@click.command(name="exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache root [default: the lock's manifest, "
              "HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub].")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Refuse to start (exit 4) unless the cache holds this lock (sizes only: milliseconds).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST[:PORT]",
              help="Let Python children connect to this host (repeatable: one HOST[:PORT] each, no commas); "
              "everything else fails at once.")
@click.option("--no-network", is_flag=True, help="Deny COMMAND and every process it starts any socket but AF_UNIX, "
              "in the kernel (seccomp): Rust, C and `python -I` too. Exit 4 without running COMMAND if the filter "
              "cannot be installed. Not with --allow-host.")
@click.option("--path", "paths", multiple=True, metavar="NAME=REPO_ID[@REVISION][:PATTERN]",
              help="Resolve from the cache, offline, the snapshot folder (or the one file matching PATTERN) and "
              "pass it as variable NAME and in place of {NAME} in the arguments (repeatable). Exit 1 if it is not "
              "cached or PATTERN matches several files.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def exec_cmd(cache_dir, lock_file, allow_hosts, no_network, paths, command) -> None:
    """Run COMMAND offline: with the variables of `hfcache env` and, for Python, a network guard.

    The guard (a sitecustomize on PYTHONPATH, chained to any existing one) makes every connection or DNS lookup
    to a host not allowed fail at once with a message, instead of hanging. With --no-network, a seccomp filter
    also denies the whole process tree every network socket, whatever the language. hfcache replaces itself with
    COMMAND (exec): signals reach it directly and its exit status is hfcache's.

    \b
    Examples:
      hfcache exec --cache-dir /opt/hf-cache -- python serve.py
      hfcache exec --lock hfcache.lock --allow-host redis:6379 -- gunicorn app:app
      hfcache exec --no-network --path MODEL=org/model-GGUF:'*Q8_0*.gguf' -- llama-server -m {MODEL}
    """
    from ..offline.env import exec_command, prepare_exec

    if command and command[0].startswith("-"):  # ignore_unknown_options passes a mistyped option on as the command
        raise UsageError(f"no such option: {command[0]}", hint="see `hfcache exec --help`; put the command after --")
    exec_command(prepare_exec(command, cache_dir=cache_dir, lock=lock_file, allow_hosts=allow_hosts,
                              no_network=no_network, paths=paths))


@click.command(name="doctor")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache to examine [default: the one "
              "huggingface_hub would use here].")
@json_option
def doctor_command(cache_dir, as_json) -> None:
    """Diagnose this environment's Hugging Face settings and cache: which cache, offline or not, conflicts,
    permissions and owner, read-only filesystem, symlinks, free space, versions; runtime traps (a read-only cache
    used online with revisions that can move upstream: an error; a umask that drops group write in a group-shared
    cache: a warning); which network enforcement `exec --no-network` can use here. Exit 1 if any error.
    """
    from ..offline.doctor import doctor
    from .render import offline as render

    report = doctor(cache_dir)
    render.show_doctor(report, as_json=as_json)
    sys.exit(report.exit_code)


@click.command(name="path")
@click.argument("spec", metavar="REPO_ID[@REVISION]")
@click.argument("pattern", required=False, metavar="[PATTERN]")
@cache_dir_option()
@click.option("--repo-type", type=click.Choice(["model", "dataset", "kernel"]), default=None,
              help="Repo type [default: model; a datasets/ or kernels/ prefix on REPO_ID sets it too].")
@click.option("--one", is_flag=True, help="Exit 1 unless exactly one file matches PATTERN (says how many did).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document: repo_id, repo_type, revision, commit_hash, snapshot, files.")
def path_command(spec, pattern, cache_dir, repo_type, one, as_json) -> None:
    """Print the absolute snapshot folder of REPO_ID@REVISION in the cache, or each file in it matching PATTERN
    (a glob as warm's --include: '*' crosses '/'), one a line. Offline: from the cache alone.

    Exit 1 when something is missing (the repo, the ref, the snapshot, a matching file, a blob), naming it and the
    `hfcache warm` command that would fetch it.

    \b
    Examples:
      vllm serve "$(hfcache path org/model@COMMIT)"
      llama-server -m "$(hfcache path org/model-GGUF '*Q8_0*.gguf' --one)"
      hfcache path datasets/org/name --json
    """
    from ..cache.root import resolve_cache_dir
    from ..errors import UsageError
    from ..offline.paths import resolve
    from .render import offline as render

    if one and pattern is None:
        raise UsageError("--one needs a PATTERN", hint="e.g. hfcache path org/model '*.gguf' --one")
    resolved = resolve(resolve_cache_dir(cache_dir), spec, pattern, repo_type=repo_type)
    if one:
        resolved.one()
    render.show_path(resolved, as_json=as_json)
