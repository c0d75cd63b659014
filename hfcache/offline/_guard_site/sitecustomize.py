"""hfcache's network guard for the Python processes ``hfcache exec`` starts (standard library only): put first on
``PYTHONPATH``, it loads ``hfcache/offline/guard.py`` by file path, installs it with ``HFCACHE_ALLOW_HOSTS`` (malformed:
no host allowed, a warning), then runs the ``sitecustomize`` it shadows, if any."""

import importlib.machinery
import importlib.util
import os
import sys


def _install_guard() -> None:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "guard.py")
    spec = importlib.util.spec_from_file_location("_hfcache_guard", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["_hfcache_guard"] = module  # before exec_module: the module's classes look themselves up there
    spec.loader.exec_module(module)
    try:
        hosts = module.hosts_from_environ()
    except ValueError as exc:  # fail closed: a malformed allow-list allows nothing, it is never split some other way
        sys.stderr.write(f"hfcache: warning: {module.ENV_ALLOW_HOSTS} is malformed ({exc}); the network guard "
                         "allows no host\n")
        hosts = ()
    module.install(hosts, enforce=True, local_only=os.environ.get(module.ENV_NO_NETWORK) == "1")


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # under its own name; what it raises reaches `site`, which reports it
    spec.loader.exec_module(module)


try:
    _install_guard()
except Exception as _exc:  # a start-up hook must not kill the child; say so instead
    sys.stderr.write(f"hfcache: warning: the network guard could not be installed: {type(_exc).__name__}: {_exc}\n")

_chain_next_sitecustomize()
