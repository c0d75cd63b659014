"""export's reads of the source cache: each file at exactly its planned size, each blob hashed against its name; a
blob linked into huggingface_hub's shared Xet store (:mod:`hfcache.cache.shared_store`) exported as its payload.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

from ..cache import safefs
from ..cache.content import HashingReader
from ..cache.fsops import open_regular
from ..cache.shared_store import StoreProblem, payload_stat
from ..errors import CacheError

_RERUN = "rerun once nothing writes the cache"


def with_store_blobs(cache_dir: str, folder: str, rev):
    """``rev`` with each entry whose blob is a store link taken as a ``link`` of the payload's size (a dangling one
    stays broken). Raises CacheError (exit 5): a store part is a link, FIFO or folder."""
    files = []
    for f in rev.files:
        xet_hash = safefs.store_link_of(cache_dir, folder, f.etag) if f.form == "broken" and f.etag else None
        if xet_hash is not None:
            try:
                st = payload_stat(cache_dir, xet_hash)
            except StoreProblem as exc:
                raise CacheError(f"{folder}/blobs/{f.etag}: {exc}: nothing exported",
                                 hint="remove it (or re-download the file), then rerun") from None
            except FileNotFoundError:
                st = None
            if st is not None:
                f = f._replace(form="link", size=st.st_size, inode=(st.st_dev, st.st_ino))
        files.append(f)
    return dataclasses.replace(rev, files=tuple(files))


def open_blob_source(path: str, etag: str):
    """Open the blob ``path`` (``<cache>/<folder>/blobs/<etag>``, or the store payload it links to) as a binary
    file. Raises CacheError: not a regular file (UnsafeLayout for a link), gone."""
    blob = Path(path)
    try:
        fd = safefs.open_blob(blob.parents[2], blob.parents[1].name, etag)
    except (FileNotFoundError, NotADirectoryError):  # removed since the plan (prune, a member): was exit 70
        raise CacheError(f"{path} is gone or changed while it was exported: nothing exported", hint=_RERUN) from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise CacheError(f"{path} is not a regular file: nothing exported", hint="remove it, then rerun")
    return f


def open_plain_source(entry):
    """Open the non-blob file of an export ``Entry`` (``entry.source`` is ``<cache>/<entry.name>``) through folders
    opened from the root. Raises CacheError (exit 5): not a regular file, a link on the way, not the planned path,
    gone."""
    suffix = "/" + entry.name
    if not entry.source.endswith(suffix):
        raise CacheError(f"{entry.source}: not the cache file planned for {entry.name}: nothing exported")
    parts = entry.name.split("/")
    try:
        with safefs.dir_fd(entry.source[: -len(suffix)], parts[:-1]) as fd:
            return os.fdopen(open_regular(fd, parts[-1], entry.source), "rb")
    except (FileNotFoundError, NotADirectoryError):  # a member renamed or swapped it since the plan (was exit 70)
        raise CacheError(f"{entry.source} is gone or changed while it was exported: nothing exported",
                         hint=_RERUN) from None


def entry_reader(entry, grown: str | None = None) -> HashingReader:
    """A reader of exactly ``entry.size`` bytes of a ``file`` entry, checked at its end (the read returning ``b""``).
    Raises CacheError (exit 5): a blob not matching its name (longer than planned: ``grown`` as the message, when
    given); another file whose size changed since the plan."""
    if not entry.etag:
        return HashingReader(open_plain_source(entry), entry.size, shown=entry.source, error=lambda _why: CacheError(
            f"{entry.source} changed while it was exported (not the size planned): nothing exported", hint=_RERUN))

    def error(why: str) -> CacheError:
        if grown is not None and why.startswith("holds more"):
            return CacheError(grown, hint=_RERUN)
        return CacheError(f"{entry.source}: content does not match its blob name (corrupt source cache)",
                          hint="run `hfcache verify --repair` on the source cache first")

    return HashingReader(open_blob_source(entry.source, entry.etag), entry.size, etag=entry.etag,
                         shown=entry.source, error=error)
