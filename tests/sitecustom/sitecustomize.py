"""Test-only interpreter setup for subprocesses, put first on PYTHONPATH by tests/users.py.

- ``HFCACHE_TEST_SITE``: a site-packages folder to add (``site.addsitedir``, so its .pth files work too): lets another
  uid run Debian's python with the test venv's packages when the venv's own interpreter is not readable by it.
- ``HFCACHE_TEST_FLOCK_ERRNO`` (``ENOSYS``, ``ENOLCK``, ``EOPNOTSUPP``): ``fcntl.flock`` fails with that errno, as it
  does on Lustre, NFS without a lock manager, or some FUSE/CIFS mounts. filelock, huggingface_hub and hfcache all
  call ``fcntl.flock`` at lock time, so the whole real locking path runs, on real files; only the kernel's answer
  to flock is replaced (a FUSE mount or an LD_PRELOAD shim would need a daemon or a compiler on CI).
"""

import errno
import os
import site

if os.environ.get("HFCACHE_TEST_SITE"):
    site.addsitedir(os.environ["HFCACHE_TEST_SITE"])

_name = os.environ.get("HFCACHE_TEST_FLOCK_ERRNO")
if _name:
    import fcntl

    _code = getattr(errno, _name)

    def _flock(fd, operation, _code=_code):
        raise OSError(_code, os.strerror(_code))

    fcntl.flock = _flock
