"""The ``hfcache`` command: Click commands (``main``), their options, the stdout guard and ``render/``.

``run`` is the console script's entry point (``pyproject.toml``: ``hfcache = "hfcache.cli:run"``) and
``python -m hfcache``'s.
"""

from .main import main, run

__all__ = ["main", "run"]
