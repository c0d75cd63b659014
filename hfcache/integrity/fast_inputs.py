"""fast_inputs: what the fast tokenizer path takes from a cache's tokenizer files, read as untrusted input.

Any member of a shared cache, a pulled image or an imported tar can write the tokenizer files. :mod:`.fast_tokenizer`
reads their fields through the typed reads here, which refuse a value of another type or out of bounds
(:class:`FastPathRefused`, one line), and hands the rest to the tokenizers library inside :func:`library_call`.

tokenizers (Rust, via pyo3) panics on some malformed files (0.23.x): a ``Precompiled`` normalizer whose
``precompiled_charsmap`` does not parse (at load) or whose trie points outside itself (at encode), a
``TemplateProcessing`` naming a special token it lacks (every encode), a BPE merge of a token the vocabulary lacks
(load), a truncation ``stride`` not below its ``max_length`` (encode). pyo3 raises a panic as
``pyo3_runtime.PanicException``, a ``BaseException`` (PyO3/pyo3#2783) whose class cannot be imported
(PyO3/pyo3#2880): :func:`is_panic` knows it by name. A failed allocation aborts the process instead (a padding of
2**58 ids, at encode): nothing in it can catch that, hence check's child reports its progress
(:func:`.check_child.probe_specs`) and the fast path switches padding and truncation off before its first encode.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The largest token id tokenizers holds (ids are Rust ``u32``).
MAX_TOKEN_ID = 2**32 - 1
#: Text encoded once, alone and as a pair, when the fast path has built a tokenizer (:func:`smoke_encode`): a panic
#: that every encode meets (a template naming a special token it does not define) is a refusal at load, not a crash
#: of the application at its first encode. Microseconds.
SMOKE_TEXT = "Hello world, 深度学习 café 😀 <s> [CLS]"


class FastPathRefused(ValueError):
    """The fast path cannot promise AutoTokenizer's ids for this repo; ``reason`` says why (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic raised through pyo3 (``pyo3_runtime.PanicException``, a ``BaseException``;
    each pyo3 extension has its own class, none importable: PyO3/pyo3#2880)."""
    return any(c.__name__ == "PanicException" and c.__module__ == "pyo3_runtime" for c in type(exc).__mro__)


def printable(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text`` (written by a cache's members or a child), control characters as
    ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``TypeName: first line of the message`` (at most ``limit`` characters of it, :func:`printable`)."""
    text = printable(str(exc).splitlines()[0], limit) if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def library_call(what: str) -> Iterator[None]:
    """Run tokenizers on the repo's validated settings: an error it raises (any ``Exception``: its Rust errors have
    no common class) or a panic (:func:`is_panic`) becomes ``FastPathRefused("<what> (<error>)")``; a
    :class:`FastPathRefused` passes as it is, and so does any other ``BaseException`` (``KeyboardInterrupt``)."""
    try:
        yield
    except FastPathRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's errors on a file have no common class
        raise FastPathRefused(f"{what} ({one_line(exc)})") from None
    except BaseException as exc:
        if not is_panic(exc):
            raise
        raise FastPathRefused(f"{what}: the tokenizers library panicked ({one_line(exc)})") from None


def smoke_encode(tokenizer: Any) -> None:
    """Encode :data:`SMOKE_TEXT` alone and as a pair with the built ``tokenizers.Tokenizer`` (padding and truncation
    off). Raises FastPathRefused when the library raises or panics on it."""
    with library_call("tokenizers fails to encode with this tokenizer"):
        tokenizer.encode(SMOKE_TEXT)
        tokenizer.encode(SMOKE_TEXT, SMOKE_TEXT)


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def flag(doc: dict, name: str, default: bool | None, where: str = "tokenizer_config.json") -> bool | None:
    """``doc[name]`` when it is true, false or null, ``default`` when absent; FastPathRefused for anything else
    (transformers hands these settings to tokenizers' Rust constructors, which take only a bool or None)."""
    value = doc.get(name, default)
    if value is None or isinstance(value, bool):
        return value
    raise FastPathRefused(f"{where}'s {name} is {_kind(value)}, not true, false or null")


def token_id(value: Any, where: str) -> int:
    """A token id: an int (or, as ``added_tokens_decoder`` keys are, its decimal text) in ``[0, MAX_TOKEN_ID]``;
    FastPathRefused for anything else."""
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,10}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FastPathRefused(f"{where}: an added token id is {_kind(value)}, not an integer")
    if not 0 <= value <= MAX_TOKEN_ID:
        raise FastPathRefused(f"{where}: an added token id {value} is outside [0, {MAX_TOKEN_ID}]")
    return value


def entries(value: Any, where: str) -> list[dict]:
    """``value`` as a list of objects (null: an empty list). Raises FastPathRefused for anything else."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise FastPathRefused(f"{where} is not a list of objects")
    return value


def vocabulary(model: dict) -> dict[str, int]:
    """A ``tokenizer.json`` model's ``vocab`` as token -> id: an object of ids in ``[0, MAX_TOKEN_ID]``, or (Unigram)
    a list of tokens or ``[token, score]`` pairs, ids by position; FastPathRefused for any other shape."""
    vocab = model.get("vocab")
    if isinstance(vocab, list):
        if not all(isinstance(t, str) or isinstance(t, list) and t and isinstance(t[0], str) for t in vocab):
            raise FastPathRefused("tokenizer.json's vocab is a list of something other than tokens")
        return {t[0] if isinstance(t, list) else t: i for i, t in enumerate(vocab)}
    if not isinstance(vocab, dict):
        raise FastPathRefused(f"tokenizer.json's vocab is {_kind(vocab)}, not an object")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TOKEN_ID for i in vocab.values()):
        raise FastPathRefused(f"tokenizer.json's vocab holds an id that is not an integer in [0, {MAX_TOKEN_ID}]")
    return vocab


def merges(model: dict) -> list[tuple[str, str]]:
    """A ``tokenizer.json`` BPE model's ``merges`` (``"a b"`` strings or ``[a, b]`` pairs; null: none);
    FastPathRefused for any other shape."""
    value = model.get("merges") or []
    pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) if isinstance(m, list) else None
             for m in (value if isinstance(value, list) else [None])]
    if not all(p is not None and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs):
        raise FastPathRefused("tokenizer.json's merges are malformed")
    return pairs  # type: ignore[return-value]


def version_before_5(value: Any) -> bool:
    """Whether ``config.json``'s ``transformers_version`` (a string, or null/absent: no version) is before 5, by its
    leading number. Raises FastPathRefused when it is not a string."""
    if value is not None and not isinstance(value, str):
        raise FastPathRefused(f"config.json's transformers_version is {_kind(value)}, not a string")
    match = re.match(r"0*(\d+)", value or "")
    return not match or len(match.group(1)) == 1 and int(match.group(1)) < 5

