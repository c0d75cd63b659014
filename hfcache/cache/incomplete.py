"""A download in progress: ``blobs/<etag>.<random>.incomplete`` (huggingface_hub's ``file_download.py`` name)."""

from __future__ import annotations

import os
from pathlib import Path


class IncompleteBlob(os.PathLike):
    """``blobs/<name>`` created relative to ``dir_fd`` (the repo's ``blobs/``, owned by this object), so publishing it
    never goes through a rebuilt path. ``os.fspath`` gives the path for messages only; every operation uses the fd."""

    def __init__(self, dir_fd: int, name: str, path: Path) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.path = path
        self.published = False

    def __fspath__(self) -> str:
        return str(self.path)

    def open_fd(self, flags: int) -> int:
        """``os.open`` of the file relative to the folder fd, ``O_NOFOLLOW``; returns an fd (caller closes)."""
        return os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)

    def close(self) -> None:
        """Close the folder fd (the file stays: a kept partial download); idempotent."""
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def unlink(self, missing_ok: bool = True) -> None:
        """Remove the ``.incomplete`` file (when not published) and close the folder fd; idempotent."""
        try:
            if self.dir_fd >= 0 and not self.published:
                os.unlink(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            if not missing_ok:
                raise
        finally:
            self.close()

    def __del__(self) -> None:
        if hasattr(self, "dir_fd"):
            self.close()
