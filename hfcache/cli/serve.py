"""``hfcache serve``: parse, run the Hub mirror (:mod:`hfcache.serve.mirror`), render (``render/offline.py``)."""

from __future__ import annotations

import click

from ..errors import UsageError
from ..records import read_token_file
from .options import cache_dir_option, parsed


@click.command()
@cache_dir_option("Hub cache to serve")
@click.option("--repos", "repos_dir", type=click.Path(file_okay=False),
              help="Serve a directory of plain repo folders (<org>/<name>/...) instead of a cache.")
@click.option("--store", metavar="s3://BUCKET/PREFIX",
              help="Serve a bucket `push s3://` wrote instead of a cache: replicas share it, bodies are 302s to "
                   "presigned URLs; with --upstream, what it lacks is fetched once and written to it.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (0.0.0.0 to accept connections from other hosts, e.g. in a pod).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port (0: any free port).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Require 'Authorization: Bearer TOKEN' with the token in this file (401 otherwise).")
@click.option("--access-log", metavar="FILE",
              help="Append one line per request (time, method, path, status, bytes, seconds) to FILE; '-': stdout.")
@click.option("--upstream", "upstreams", multiple=True, metavar="URL",
              help="Pull through: fetch what the cache lacks from this Hub endpoint, verified, and keep it "
                   "(repeatable: tried in order).")
@click.option("--upstream-token-file", type=click.Path(dir_okay=False),
              help="Token sent to the upstreams only (never logged, never answered). Default: none.")
@click.option("--allow", multiple=True, metavar="REPO_GLOB",
              help="Only pull through repos whose id matches (fnmatch, repeatable); others get 403. Default: all.")
@click.option("--max-size", metavar="SIZE", callback=parsed("parse_size"),
              help="Prune least-recently-served revisions to keep the cache at most SIZE (50GB, 20GiB, ...).")
@click.option("--revalidate", metavar="DURATION", callback=parsed("parse_duration"),
              help="Ask upstream again for a branch or tag at most this often [default: 5m].")
@click.option("--upstream-slots", type=click.IntRange(1, 256), default=None, metavar="N",
              help="Upstream fetches (and requests waiting on them) at once; one more gets 503 + Retry-After, so a "
                   "slow upstream never holds the threads of cached answers [default: 32].")
def serve(cache_dir, repos_dir, store, host, port, token_file, access_log, upstreams, upstream_token_file, allow,
          max_size, revalidate, upstream_slots) -> None:
    """Serve a cache as a Hub mirror (HF_ENDPOINT / --endpoint for every pod); with --upstream, pull through.

    It answers what the cache holds, at its commits and refs, including what its .no_exist markers know is
    absent; unmodified huggingface_hub and transformers clients download from it. With --upstream, what the
    cache lacks is fetched with warm's code path (hash-checked before anyone sees it), kept, then answered;
    when upstream is down, the cache is still served. GET /metrics is Prometheus text; GET /healthz says
    whether upstream answers. Runs until SIGTERM or Ctrl-C, then lets downloads in flight finish (up to 20 s).

    \b
    Examples:
      hfcache serve --cache-dir /data/hf-cache
      hfcache serve --cache-dir /data/hf-cache --host 0.0.0.0 --token-file /run/secrets/mirror-token
      hfcache serve --cache-dir /data/hf-cache --upstream https://huggingface.co \\
          --upstream-token-file /run/secrets/hf-token --allow 'google-bert/*' --max-size 200GB
    """
    from ..serve.mirror import serve as serve_mirror
    from ..serve.pullthrough import PullThroughConfig
    from .render import offline as render

    token = read_token_file(token_file) if token_file else None
    upstream = None
    if upstreams:
        upstream_token = read_token_file(upstream_token_file, "--upstream-token-file") if upstream_token_file else None
        given = {"revalidate": revalidate, "upstream_slots": upstream_slots}  # None: PullThroughConfig's default
        upstream = PullThroughConfig(upstreams=tuple(upstreams), token=upstream_token, allow=tuple(allow),
                                     max_size=max_size, **{k: v for k, v in given.items() if v is not None})
    elif (upstream_token_file or allow or max_size is not None or revalidate is not None
          or upstream_slots is not None):
        raise UsageError("--upstream-token-file, --allow, --max-size, --revalidate and --upstream-slots need "
                         "--upstream", hint="add --upstream URL (e.g. https://huggingface.co) to pull through")
    if store is not None and max_size is not None:
        raise UsageError("--max-size prunes a cache; a bucket (--store) is pruned by its lifecycle rules")
    if repos_dir is None and store is None:  # a cache that is another's home (an HF_HOME, a repo folder) served an empty mirror
        from ..cache.root import refuse_misplaced_cache, resolve_cache_dir

        refuse_misplaced_cache(resolve_cache_dir(cache_dir))
    run = serve_mirror(cache_dir=cache_dir, repos_dir=repos_dir, host=host, port=port, token=token,
                       access_log=access_log, ready=render.show_mirror_ready, upstream=upstream, store=store)
    render.show_mirror_stopped(run)
