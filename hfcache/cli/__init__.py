"""The ``hfcache`` command (docs/architecture.md); ``run`` is the console script and ``python -m hfcache``."""

from .main import main, run

__all__ = ["main", "run"]
