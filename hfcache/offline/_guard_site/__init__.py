"""The folder `hfcache exec` puts first on a Python child's PYTHONPATH: it holds the guard's ``sitecustomize``."""
