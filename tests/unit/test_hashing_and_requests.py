"""Blob hashing as the Hub names blobs, safe repo paths, and request parsing."""

import hashlib
import os
import subprocess

import pytest

from hfcache.cache.content import fd_matches
from hfcache.errors import UsageError
from hfcache.hub.files import RemoteFile
from hfcache.records import UnsafePath, WarmRequest, validate_repo_path


def hash_file(path: str, file: RemoteFile) -> bool:
    return fd_matches(os.open(path, os.O_RDONLY | os.O_NONBLOCK), file.etag, file.size)


def test_a_fifo_is_never_read_nor_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert not hash_file(str(tmp_path / "fifo"), RemoteFile("x", 0, "0" * 40))


def test_git_blob_sha1_matches_git_hash_object(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_bytes(b"[PAD]\n[UNK]\nhello\n")
    expected = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True, check=True).stdout.strip()
    assert hash_file(str(f), RemoteFile("vocab.txt", f.stat().st_size, expected))
    assert not hash_file(str(f), RemoteFile("vocab.txt", f.stat().st_size, "0" * 40))


def test_lfs_files_are_checked_by_sha256_and_size(tmp_path):
    f = tmp_path / "tokenizer.model"
    f.write_bytes(b"\x00\x01" * 100)
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    remote = RemoteFile("tokenizer.model", 200, "1" * 40, digest)
    assert remote.etag == digest and remote.hash == f"sha256:{digest}"
    assert hash_file(str(f), remote)
    assert not hash_file(str(f), RemoteFile("tokenizer.model", 199, "1" * 40, digest))


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs", "a/../../b", "a\\b", "a//b", "./a", "", "a/."])
def test_unsafe_listing_paths_are_refused(path):
    with pytest.raises(UnsafePath):
        validate_repo_path(path)


def test_safe_listing_paths_pass():
    assert validate_repo_path("1_Pooling/config.json") == "1_Pooling/config.json"


def test_request_parsing():
    req = WarmRequest.parse("openai-community/gpt2@v1.0", kind="model")
    assert (req.repo_id, req.revision, req.kind) == ("openai-community/gpt2", "v1.0", "model")
    assert WarmRequest.parse("bert-base-uncased").revision == "main"
    assert WarmRequest.parse("a/b@refs/pr/1").revision == "refs/pr/1"


@pytest.mark.parametrize("spec", ["bad//id", "a/b/c", "-x/y", "repo@", "a/b@../../etc", "a/b@/abs", "a/b@x y", ""])
def test_malformed_specs_are_usage_errors(spec):
    with pytest.raises(UsageError):
        WarmRequest.parse(spec)


def test_include_must_be_a_sequence_of_globs_not_a_string():
    with pytest.raises(UsageError, match="include must be a sequence"):
        WarmRequest("gpt2", include="*.json")
    assert WarmRequest("gpt2", exclude=["*.bin"]).exclude == ("*.bin",)


@pytest.mark.parametrize("repo_id, path, repo_type, revision", [
    ("bert-base-uncased", "tokenizer.json", "model", "main"),
    ("org/name", "a b/c#d?.json", "model", "0" * 40),
    ("org/data", "x%y/ü.txt", "dataset", "refs/pr/1"),
    ("org/space", "app.py", "space", "v1.0+x"),
])
def test_resolve_url_is_hf_hub_url(repo_id, path, repo_type, revision):
    # hfcache builds the resolve URL itself (no file_download import on the warm path): it must stay the library's.
    from huggingface_hub import hf_hub_url

    from hfcache.hub.urls import resolve_url
    expected = hf_hub_url(repo_id, path, repo_type=repo_type, revision=revision, endpoint="http://127.0.0.1:9")
    assert resolve_url("http://127.0.0.1:9", repo_id, path, repo_type, revision) == expected
