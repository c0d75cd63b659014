"""Rendering, one module per command group (``offline``: env, doctor, path and serve; ``sign``'s is
:mod:`hfcache.cli.sign`; ``common``: what all share, where stdout and stderr are told apart)."""
