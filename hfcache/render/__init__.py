"""Rendering, one module per command group: rich progress and tables on stderr for people, one JSON document on
stdout for machines. Nothing here decides anything; it only shows the frozen dataclasses the core returns.

- :mod:`.common`   the stderr console, ``print_json``, ``print_error``, sizes and times for people
- :mod:`.warm`     ``warm`` and ``lock``
- :mod:`.ls`       ``ls``
- :mod:`.verify`   ``verify`` and ``check``
- :mod:`.prune`    ``prune``
- :mod:`.transfer` ``export``, ``import`` and ``link``
- :mod:`.offline`  ``env``, ``doctor`` and ``serve``
- :mod:`.oci`      ``push`` and ``pull``

Only :mod:`hfcache.cli` and :mod:`hfcache.cli_oci` import these (tests/unit/test_import_graph.py checks that no core module imports rich).
"""
