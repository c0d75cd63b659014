"""A file export (or ``push --format modelpack``) planned, then removed before it is opened (``prune``, a group
member) is exit 5 naming it, never exit 70: the planned source opens of ``move/export_store.py`` on a real cache
layout whose file is gone (a FileNotFoundError escaped both as an internal error; seen under a member's swap loop)."""

from __future__ import annotations

import pytest

from hfcache.errors import CacheError
from hfcache.move.export import Entry
from hfcache.move.export_store import open_blob_source, open_plain_source

ETAG = "a" * 64
FOLDER = "models--acme--gone"


def test_a_blob_removed_after_the_plan_is_exit_5(tmp_path):
    (tmp_path / FOLDER / "blobs").mkdir(parents=True)
    with pytest.raises(CacheError) as caught:
        open_blob_source(str(tmp_path / FOLDER / "blobs" / ETAG), ETAG)
    assert caught.value.exit_code == 5 and "gone or changed while it was exported" in caught.value.message


@pytest.mark.parametrize("name", ["trees/" + "b" * 40 + ".json", "refs/main"])
def test_a_planned_file_removed_or_its_folder_gone_is_exit_5(tmp_path, name):
    (tmp_path / FOLDER / "refs").mkdir(parents=True)  # trees/ is missing, refs/main too
    entry = Entry(f"{FOLDER}/{name}", "file", source=str(tmp_path / FOLDER / name), size=10)
    with pytest.raises(CacheError) as caught:
        open_plain_source(entry)
    assert caught.value.exit_code == 5 and "gone or changed while it was exported" in caught.value.message
