"""Rendering, one module per command group: a command's result (table, summary line, or one JSON document with
--json) on stdout; rich progress, waits and errors on stderr. Nothing here decides anything; it only shows the
frozen dataclasses the core returns.

- :mod:`.common`   the stdout and stderr consoles, ``print_json``, ``print_error``, sizes and times for people
- :mod:`.warm`     ``warm`` and ``lock``
- :mod:`.ls`       ``ls``
- :mod:`.verify`   ``verify`` and ``check``
- :mod:`.prune`    ``prune``
- :mod:`.transfer` ``export``, ``import`` and ``link``
- :mod:`.offline`  ``env``, ``doctor`` and ``serve``
- :mod:`.oci`      ``push`` and ``pull``

Only the command modules of :mod:`hfcache.cli` (``warm.py``, ``ls.py``, ... beside ``main.py``) import these
(tests/unit/test_import_graph.py checks that no core module imports rich).
"""
