"""fast_inputs: what the fast tokenizer path takes from a cache's tokenizer files, read as untrusted input (any
member of a shared cache, a pulled image or an imported tar can write them): typed reads refuse a value of another
type or out of bounds (:class:`FastPathRefused`, one line); the rest goes to tokenizers inside :func:`library_call`.

tokenizers (Rust, via pyo3) panics on some malformed files (0.23.x): a ``Precompiled`` normalizer whose
``precompiled_charsmap`` does not parse (at load) or whose trie points outside itself (at encode), a
``TemplateProcessing`` naming a special token it lacks (every encode), a BPE merge of a token the vocabulary lacks
(load), a truncation ``stride`` not below its ``max_length`` (encode). A failed allocation aborts the process instead
(a padding of 2**58 ids, at encode): nothing in it can catch that, hence check's child reports its progress
(:func:`.check_child.probe_specs`) and the fast path switches padding and truncation off before its first encode.
Chains that grow a text without bound: :func:`growth`; lone surrogates: :func:`text`.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The largest token id tokenizers holds (ids are Rust ``u32``).
MAX_TOKEN_ID = 2**32 - 1
#: Encoded by :func:`smoke_encode` (microseconds): a panic every encode meets is a refusal at load, not a crash of
#: the application at its first encode.
SMOKE_TEXT = "Hello world, 深度学习 café 😀 <s> [CLS]"


class FastPathRefused(ValueError):
    """The fast path cannot promise AutoTokenizer's ids for this repo; ``reason`` says why (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic raised through pyo3: ``pyo3_runtime.PanicException``, a ``BaseException``
    (PyO3/pyo3#2783); each pyo3 extension has its own class, none importable (PyO3/pyo3#2880)."""
    return any(c.__name__ == "PanicException" and c.__module__ == "pyo3_runtime" for c in type(exc).__mro__)


def reraise_unless_failure(exc: BaseException) -> None:
    """Called in an ``except BaseException`` clause: re-raise it unless ``exc`` is an ``Exception`` or a panic
    (:func:`is_panic`): KeyboardInterrupt and SystemExit pass."""
    if not isinstance(exc, Exception) and not is_panic(exc):
        raise


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
    except Exception as exc:  # the library's errors on a file have no common class
        raise FastPathRefused(f"{what} ({one_line(exc)})") from None
    except BaseException as exc:
        if not is_panic(exc):
            raise
        raise FastPathRefused(f"{what}: the tokenizers library panicked ({one_line(exc)})") from None


def smoke_encode(tokenizer: Any) -> None:
    """Encode :data:`SMOKE_TEXT` alone and as a pair with the built ``tokenizers.Tokenizer``; FastPathRefused when
    the library raises or panics on it."""
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


def text(value: Any, where: str) -> str:
    """``value`` when it is a string UTF-8 can encode (the library's strings are Rust's); FastPathRefused for
    anything else, a lone surrogate included (pyo3 raises UnicodeEncodeError, which no caller expects)."""
    if not isinstance(value, str):
        raise FastPathRefused(f"{where} is {_kind(value)}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FastPathRefused(f"{where} holds a lone surrogate ({printable(ascii(value), 40)}): not text tokenizers "
                              "takes") from None
    return value


#: The largest growth, in characters, the fast path takes from one chain of a ``tokenizer.json`` (normalizers,
#: pre-tokenizers, decoders, post-processors): a text (or an encoding's ids) at most this many times as long.
MAX_GROWTH = 16
#: Worst growth of one application of a Unicode normalization, in characters (Unicode 14 tables: NFKC/NFKD U+FDFA
#: 18, NFD U+1F82 4, NFC U+FB2C 3, lowercase U+0130 2; BERT's pads a CJK character with two spaces; a sentencepiece
#: charsmap, ``Precompiled``: its longest replacement, 18 in nmt_nfkc's). Normalizing a text once is what a
#: tokenizer does: a chain's first run of these steps counts its growth over :data:`_ONCE` only; a later run (one a
#: ``Replace``/``Prepend`` step can feed, ``ア -> ㌂`` then NFKC) and any second charsmap (its map is the file's
#: choice) count in full.
_UNICODE = {"NFKC": 18, "NFKD": 18, "NFD": 4, "NFC": 3, "Lowercase": 2, "BertNormalizer": 3, "Precompiled": 1,
            "StripAccents": 1, "Strip": 1, "Nmt": 1}
_ONCE = 18
#: Growth of the other steps that are no string the file chose, by chain: ``ByteLevel`` maps each byte of a
#: character to one, a word gets a metaspace, a decoder joins tokens with a space.
_FIXED = {"normalizer": {"ByteLevel": 4}, "pre_tokenizer": {"ByteLevel": 4, "Metaspace": 2},
          "decoder": {"WordPiece": 2, "BPEDecoder": 2}, "post_processor": {}}
_CHAINS = (("normalizer", "normalizers"), ("pre_tokenizer", "pretokenizers"), ("decoder", "decoders"),
           ("post_processor", "processors"))


def growth(doc: dict) -> None:
    """Refuse (FastPathRefused) a ``tokenizer.json`` whose normalizer, pre-tokenizer, decoder or post-processor can
    make a text or its ids more than :data:`MAX_GROWTH` times longer: the product over a chain (``Sequence`` steps
    nested or not) of each step's worst growth (:func:`_step`), runs of Unicode steps counted as :data:`_UNICODE`
    says."""
    for name, key in _CHAINS:
        factor = _chain_growth([(step, _step(step, name)) for step in _steps(doc.get(name), key)])
        if factor > MAX_GROWTH:
            shown = f"{factor:.3g}" if factor < 1e30 else "over 1e30"
            what = "an encoding's ids" if name == "post_processor" else "a text"
            raise FastPathRefused(f"tokenizer.json's {name} can make {what} {shown} times longer (its steps' worst "
                                  f"growths multiply), over the {MAX_GROWTH} the fast path takes: one encode could "
                                  "exhaust the memory")


def _chain_growth(steps: list[tuple[dict, float]]) -> float:
    """The product of ``steps``' growths, a run of consecutive Unicode steps as its largest member (the first run
    of the chain over :data:`_ONCE`), a charsmap after the first in full; at most 1e30."""
    factor, run, runs, charsmaps = 1.0, 0.0, 0, 0
    for step, grows in [*steps, ({}, 1.0)]:  # the sentinel ends the last run
        kind = _step_type(step)
        if kind in _UNICODE:
            charsmaps += kind == "Precompiled"
            run = max(run, grows) if charsmaps < 2 or kind != "Precompiled" else max(run, 1.0) * grows
            continue
        if run:
            factor *= max(1.0, run / _ONCE) if runs == 0 else run
            run, runs = 0.0, runs + 1
        factor = min(factor * grows, 1e30)
    return factor


def _steps(node: Any, key: str) -> Iterator[dict]:
    """The steps of a chain, ``Sequence`` nodes (their list under ``key``) flattened in order; other values
    (null, a list, a malformed step) have none: the library refuses what it cannot parse."""
    if not isinstance(node, dict):
        return
    if _step_type(node) == "Sequence" and isinstance(node.get(key), list):
        for child in node[key]:
            yield from _steps(child, key)
    else:
        yield node


def _step(step: dict, chain: str) -> float:
    """One step's worst growth in characters: ``Replace`` content over the shortest text its pattern matches
    (content + 1 when it can match nothing), ``Prepend`` 1 + its length per piece, ``Precompiled`` its charsmap's
    longest replacement, a template's count of ``$A``/``$B``, :data:`_UNICODE`/:data:`_FIXED`; 1 for the others."""
    kind = _step_type(step)
    if kind == "Replace":
        content = step.get("content")
        shortest = _shortest_match(step.get("pattern"))
        size = len(content) if isinstance(content, str) else 0
        return float(size + 1) if shortest == 0 else max(1.0, size / shortest)
    if kind == "Prepend":
        return 1.0 + (len(step["prepend"]) if isinstance(step.get("prepend"), str) else 0)
    if kind == "Precompiled":
        return float(_charsmap_growth(step.get("precompiled_charsmap")))
    if kind == "TemplateProcessing":
        return float(max(_pieces(step.get("single")), _pieces(step.get("pair")), 1))
    return float(_UNICODE.get(kind, 1) if chain == "normalizer" else 1) * _FIXED[chain].get(kind, 1)


def _step_type(step: dict) -> str:
    """A step's ``type`` when it is a string, else "" (the library refuses the step; a list or object is no key of
    the tables above: ``TypeError: unhashable type`` escaped the refusal)."""
    kind = step.get("type")
    return kind if isinstance(kind, str) else ""


def _shortest_match(pattern: Any) -> int:
    """The fewest characters a ``Replace`` pattern (``{"String": s}`` or ``{"Regex": r}``) matches; 0 when it can
    match the empty text or cannot be read (Python's parser stands in for Oniguruma's: where it fails, 0). A
    pattern with a bracket counts at most 1: Python reads Oniguruma's POSIX brackets (``[[:alpha:][:alpha:]]``,
    one letter) and class intersections (``[a-z&&[a-z]]``) as wider, which made a ``Replace`` of K+1 characters
    look like no growth."""
    if not isinstance(pattern, dict):
        return 0
    if isinstance(pattern.get("String"), str):
        return len(pattern["String"])
    regex = pattern.get("Regex")
    if not isinstance(regex, str):
        return 0
    from re import _parser  # the stdlib's own parser: a regex's minimum width, never compiled

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            low = _parser.parse(regex).getwidth()[0]
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        return 0
    if "[" in regex:
        low = min(low, 1)
    return low if 0 < low < 1 << 31 else 0


def _charsmap_growth(charsmap: Any) -> int:
    """The longest replacement (characters) of a ``Precompiled`` normalizer's sentencepiece charsmap (a ``uint32``
    trie size, the trie, then NUL-separated replacements); 1 when there is none it can read (the library refuses a
    charsmap it cannot parse)."""
    if not isinstance(charsmap, str):
        return 1
    try:
        raw = base64.b64decode(charsmap, validate=False)
        (size,) = struct.unpack("<I", raw[:4])
    except (binascii.Error, struct.error, ValueError):
        return 1
    strings = raw[4 + size:].split(b"\0")
    return max((len(s.decode("utf-8", "replace")) for s in strings), default=1) or 1


def _pieces(template: Any) -> int:
    """How often a post-processor template names a sequence (``$A``, ``$B``, ``$0``...): the ids it repeats."""
    if isinstance(template, str):
        return sum(piece.startswith("$") for piece in template.split())
    if isinstance(template, list):
        sequences = [p["Sequence"] for p in template if isinstance(p, dict) and isinstance(p.get("Sequence"), dict)]
        return max((sum(s.get("id") == name for s in sequences) for name in ("A", "B")), default=0)
    return 0
