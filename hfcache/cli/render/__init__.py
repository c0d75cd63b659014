"""Rendering, one module per command group (``offline``: env, doctor, path and serve; ``sign``'s is
:mod:`hfcache.cli.sign`; ``common``: what all share): a command's result (table, summary line, or one JSON document
with --json) on stdout; progress, waits and errors on stderr. It shows the dataclasses the core returns.
"""
