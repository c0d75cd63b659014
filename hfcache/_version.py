"""The package version, in a leaf module: hfcache/__init__.py re-exports it, and modules below it import it from
here (importing it from the package would make them depend on the package facade, which imports them: a cycle)."""

__version__ = "0.1.0"
