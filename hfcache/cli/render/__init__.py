"""Rendering, one module per command group: a command's result (table, summary line, or one JSON document with
--json) on stdout; rich progress, waits and errors on stderr. Nothing here decides anything: it shows the frozen
dataclasses the core returns. Only the command modules of :mod:`hfcache.cli` import these (no core module imports
rich: tests/unit/test_import_graph.py).

- :mod:`.common`   the stdout and stderr consoles, ``print_json``, ``print_error``, sizes and times for people
- :mod:`.warm`     ``warm`` and ``lock``
- :mod:`.ls`       ``ls``
- :mod:`.verify`   ``verify`` and ``check`` (``sign`` and ``verify --signature``: :mod:`hfcache.cli.sign`)
- :mod:`.prune`    ``prune``
- :mod:`.move`     ``export``, ``import`` and ``link``
- :mod:`.offline`  ``env``, ``doctor`` and ``serve``
- :mod:`.path`     ``path``
- :mod:`.oci`      ``push`` and ``pull``
"""
