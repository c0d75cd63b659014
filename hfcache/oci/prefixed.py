"""``hfcache push --prefix DIR`` for the image format: the layer tar of an export plan with every entry under
``DIR/`` (KServe's Modelcar reads ``/models``, an ``oci+native://`` image volume mounts ``subPath: models``).

Library gap: :func:`hfcache.move.export.write_tar` names each tar entry by its plan entry, and the plan's names
are also how its files are opened safely (from the cache root, folder by folder), so a prefixed plan cannot be
handed to it. This writer is the same loop (same modes, mtime 0, owner 0, PAX, the same hashed and sized reads
through :mod:`hfcache.move.export_store`) with the names prefixed; relative symlink targets stay as they are
(they point inside the same repo folder), hardlink targets get the prefix.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import BinaryIO

from ..move.export import ExportPlan
from ..move.export_store import HashingReader, SizedReader, open_plain_source

__all__ = ["write_prefixed_tar"]


class _DigestWriter(io.RawIOBase):
    def __init__(self, out: BinaryIO) -> None:
        self._out, self.digest = out, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        self._out.write(data)
        return len(data)


def _dirs(prefix: str) -> list[str]:
    parts = prefix.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def write_prefixed_tar(plan: ExportPlan, out: BinaryIO, prefix: str) -> str:
    """Write ``plan`` as a reproducible tar with every entry under ``prefix/``; return the sha256 of the tar.

    Args:
        plan: an export plan (names relative to the cache root); out: the binary stream written;
        prefix: a checked relative folder (:func:`hfcache.oci.modelpack.check_prefix`), not empty.

    Raises:
        CacheError: a blob does not match its name, a file changed size or was swapped for a link (exit 5).
    """
    sink = _DigestWriter(out)
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in _dirs(prefix):
            info = _info(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for e in plan.entries:
            info = _info(f"{prefix}/{e.name}")
            if e.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif e.kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.target, 0o777
                tar.addfile(info)
            elif e.kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, f"{prefix}/{e.target}"
                tar.addfile(info)
            elif e.kind in ("empty", "data"):
                data = e.target.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = e.size
                reader = HashingReader(e.source, e.etag, e.size) if e.etag else \
                    SizedReader(open_plain_source(e), e.size, e.source)
                with reader:
                    tar.addfile(info, reader)
                    reader.read()  # reach EOF: a blob's hash, another file's size is checked there
    out.flush()
    return sink.digest.hexdigest()


def _info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
    return info
