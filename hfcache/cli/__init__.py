"""The ``hfcache`` command: Click commands, their options, the stdout guard and ``render/``; ``run`` is the console
script (``pyproject.toml``) and ``python -m hfcache``."""

from .main import main, run

__all__ = ["main", "run"]
