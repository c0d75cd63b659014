"""hfcache: provision Hugging Face tokenizer and model caches for images, volumes and clusters. The Python API is the
product; the ``hfcache`` command is a thin layer over it::

    import hfcache
    report = hfcache.warm([hfcache.WarmRequest.parse("bert-base-uncased")], cache_dir="/opt/hf-cache")
    assert report.ok
"""

from ._version import __version__
from .errors import HfcacheError
from .records import RepoResult, WarmReport, WarmRequest


def __getattr__(name: str):
    # Lazy: `warm` pulls in huggingface_hub's HTTP stack; the light `warm --lock` check must not pay for it.
    if name == "warm":
        from .warming.orchestrate import warm

        return warm
    # Lazy too: an application calls enforce_offline() before it imports transformers, so this import stays light.
    if name in ("enforce_offline", "load_tokenizer"):
        from .offline import api

        return getattr(api, name)
    raise AttributeError(name)


__all__ = ["HfcacheError", "RepoResult", "WarmReport", "WarmRequest", "__version__", "enforce_offline",
           "load_tokenizer", "warm"]
