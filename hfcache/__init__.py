"""hfcache: provision Hugging Face tokenizer and model caches for images, volumes and clusters.

The Python API is the product; the ``hfcache`` command is a thin layer over it::

    import hfcache
    report = hfcache.warm([hfcache.WarmRequest.parse("bert-base-uncased")], cache_dir="/opt/hf-cache")
    assert report.ok
"""

__version__ = "0.1.0"

from .errors import HfcacheError  # noqa: E402
from .warm import RepoResult, WarmReport, WarmRequest, warm  # noqa: E402

__all__ = ["HfcacheError", "RepoResult", "WarmReport", "WarmRequest", "__version__", "warm"]
