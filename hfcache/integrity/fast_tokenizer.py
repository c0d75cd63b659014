"""fast_tokenizer: a ``tokenizers.Tokenizer`` from a cached ``tokenizer.json``, set up as transformers sets it up.

``AutoTokenizer.from_pretrained`` (transformers 5.24, ``tokenization_auto.py``, ``tokenization_utils_tokenizers.py``,
``models/{bert,llama,gpt2}/tokenization_*.py``) does more than read ``tokenizer.json``; this replays it for the
classes it knows, without importing transformers (~0.8 s): the class (:func:`resolve_class`); ``TokenizersBackend``
loads the file as it is, ``BertTokenizer``/``LlamaTokenizer``/``GPT2Tokenizer`` rebuild model, normalizer and
pre-tokenizer and keep the file's post-processor (:func:`_rebuild`); added and special tokens in transformers' order,
``split_special_tokens``, BERT's template; truncation and padding off, as ``__call__``'s defaults. Fields are read
through :mod:`.fast_inputs`. ``hfcache check`` proves the result equal to ``AutoTokenizer`` on
:mod:`.tokenizer_corpus` and records it (:mod:`.fast_record`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bounds import loads_json
from ..cache import safefs
from ..cache.root import repo_folder_name
from ..errors import CacheError
from ..names import is_commit
from . import fast_inputs as read
from .fast_inputs import FastPathRefused, library_call, smoke_encode

__all__ = ["FastPathRefused", "FastTokenizer", "NotCached", "build", "resolve_class", "resolve_commit"]

MAX_TOKENIZER_JSON = 512 * 1024 * 1024  # the largest Hub tokenizer.json files are ~30 MB
MAX_CONFIG_JSON = 16 * 1024 * 1024
GENERIC = frozenset({"TokenizersBackend", "PreTrainedTokenizer", "PythonBackend", "FNetTokenizer",
                     "ParakeetTokenizer"})
REBUILT = frozenset({"BertTokenizer", "LlamaTokenizer", "GPT2Tokenizer"})
#: transformers 5.24 ``TOKENIZER_MAPPING_NAMES`` rows whose class is replicated here (model_type -> class).
MODEL_TYPES = {
    **dict.fromkeys((
        "EvollaModel arctic aria beam bigbird_pegasus camembertv2-base canary chatlm cohere_asr ernie4_5 ernie4_5_moe "
        "flex_olmo fuyu glm glm4 glm4_moe glm4_moe_lite glm4v glm4v_moe glm_image glmasr got_ocr2 gpt_bigcode "
        "gradium_phonon_tts granite granitemoe granitemoehybrid granitemoeshared h2ovl_chat hyperclovax "
        "hyperclovax_vlm internlm2 internlm3 iquestcoder jamba kimi_k25 kimi_linear kosmos-2 llava llava_next "
        "mimo_v2_flash minicpm3 minicpm_ocr minicpmv minicpmv4_6 minicpmv4_7 minimax_m2 ministral ministral3 mistral "
        "mistral3 mistral_large4 mixtral modernbert modernbert-decoder molmo molmo2 nemo_speechlm nemotron nvfp4 "
        "nystromformer olmo2 olmo3 olmo_hybrid omniasr opencua openvla paddleocr_vl pegasus_x persimmon phi3 phi3_v "
        "phimoe pix2struct pixtral pocket_tts smolvlm stablelm step3_vl umt5 vipllava voxtral voxtral_realtime "
        "xlm-roberta-xl").split(), "TokenizersBackend"),
    **dict.fromkeys((
        "align bark bert blip bros chinese_clip convbert distilbert electra ernie flava git grounding-dino layoutlm "
        "megatron-bert mm-grounding-dino nezha nomic_bert qdqbert realm retribert squeezebert tvp vilt "
        "visual_bert").split(), "BertTokenizer"),
    **dict.fromkeys("idefics idefics2".split(), "LlamaTokenizer"),
    **dict.fromkeys((
        "blip-2 codegen dbrx emu3 gpt2 gpt_neo gptj hyperclovax_vision_v2 instructblip instructblipvideo jais2 opt phi "
        "starcoder2").split(), "GPT2Tokenizer"),
}
#: transformers 5.24 ``MODEL_IDS_TO_TOKENIZERS_BACKEND``: a config.json ``_name_or_path`` matching one loads
#: ``TokenizersBackend`` whatever the declared class.
_BACKEND_IDS = re.compile(r"deepseek-ai/deepseek-r1-distill-llama-.*|deepseek-ai/deepseek-coder-.*|"
                          r"allenai/dolma2-tokenizer|google/umt5-small|naver-clova-ix/donut-.*|salesforce/blip2-opt-.*|"
                          r"salesforce/blip2-flan-t5-.*|salesforce/instructblip-flan-t5-.*|stepfun-ai/step-3\.7-.*")
_MISTRAL_TYPES = frozenset({"mistral", "mistral3", "voxtral", "ministral", "pixtral"})
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_DEFAULTS = {
    "BertTokenizer": {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"},
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "GPT2Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
}
HINT = "use backend=\"transformers\" (AutoTokenizer) for this repo"


class NotCached(LookupError):
    """The cache lacks the repo, its revision, or a file the load needs; the message names it."""


@dataclass(frozen=True)
class FastTokenizer:
    """What :func:`build` made: the ``tokenizers.Tokenizer``, the ``commit`` it was read from and the transformers
    ``tokenizer_class`` whose load it replays."""

    tokenizer: Any
    commit: str
    tokenizer_class: str


def resolve_commit(cache_dir: Path, folder: str, revision: str) -> str:
    """The commit ``revision`` (a 40-hex commit, or a ref name read from ``refs/``) stands for in ``folder``. Raises
    NotCached: no such ref, or the snapshot folder is missing; CacheError: a planted link, a bad ref name."""
    if is_commit(revision):
        commit = revision
    else:
        try:
            raw = safefs.read_small(cache_dir, (folder, "refs", *safefs.check_ref_name(revision).split("/")), 1024)
        except FileNotFoundError:
            raise NotCached(f"no ref {revision!r} in {folder}/refs") from None
        except OSError as exc:
            raise _unreadable(f"{folder}/refs/{revision}", exc) from None
        commit = raw.decode("ascii", "replace").strip()
        if not is_commit(commit):
            raise CacheError(f"{folder}/refs/{revision} does not hold a commit", hint="hfcache verify --repair")
    _must_exist(cache_dir, (folder, "snapshots", commit), f"no snapshot {commit[:12]} in {folder}")
    return commit


def _must_exist(cache_dir: Path, rel: tuple[str, ...], missing: str) -> None:
    """NotCached(``missing``) unless the folder ``rel`` exists (no link followed on the way)."""
    try:
        os.close(safefs.open_dir(cache_dir, rel))
    except FileNotFoundError:
        raise NotCached(missing) from None
    except OSError as exc:
        raise _unreadable("/".join(rel), exc) from None


def _unreadable(what: str, exc: OSError) -> CacheError:
    return CacheError(f"{what} cannot be read ({exc.strerror or exc})",
                      hint="ask the cache's owner to make it readable (`hfcache doctor` prints the fix)")


def _read(cache_dir: Path, folder: str, commit: str, name: str, limit: int) -> bytes | None:
    """The bytes of the snapshot's ``name`` (None when absent). Raises FastPathRefused past ``limit`` bytes."""
    try:
        raw = safefs.read_repo_file(cache_dir, folder, (commit, name), limit + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unreadable(f"{folder}/snapshots/{commit[:12]}/{name}", exc) from None
    if len(raw) > limit:
        raise FastPathRefused(f"{name} is larger than {limit} bytes")
    return raw


def _read_json(cache_dir: Path, folder: str, commit: str, name: str) -> dict | None:
    return _json(_read(cache_dir, folder, commit, name, MAX_CONFIG_JSON), name)


def _json(raw: bytes | None, name: str) -> dict | None:
    """``raw`` parsed as a JSON object (``tokenizer.json``: with a ``model`` object); None for None."""
    if raw is None:
        return None
    try:
        doc = loads_json(raw, name)
    except ValueError as exc:
        raise FastPathRefused(f"{name} cannot be parsed ({exc})") from None
    if name == "tokenizer.json" and not (isinstance(doc, dict) and isinstance(doc.get("model"), dict)):
        raise FastPathRefused("tokenizer.json has no model")
    if not isinstance(doc, dict):
        raise FastPathRefused(f"{name} is not a JSON object")
    return doc


def resolve_class(tk_config: dict, config: dict | None) -> str:
    """The transformers class ``AutoTokenizer`` would load (``tokenization_auto.py`` 5.24), as far as replicated.
    FastPathRefused: custom code, or a class (or a choice between classes) not replicated here."""
    config = config or {}
    for where, doc in (("tokenizer_config.json", tk_config), ("config.json", config)):
        auto_map = doc.get("auto_map")
        if isinstance(auto_map, (list, tuple)) or (isinstance(auto_map, dict) and "AutoTokenizer" in auto_map):
            raise FastPathRefused(f"custom code: {where}'s auto_map names a tokenizer class")
    declared = tk_config.get("tokenizer_class") or config.get("tokenizer_class")
    model_type = config.get("model_type")
    if declared is not None and not isinstance(declared, str) or model_type is not None and \
            not isinstance(model_type, str):
        raise FastPathRefused("tokenizer_class or model_type is not a string")
    declared = declared.removesuffix("Fast") if declared else None
    if declared == "PreTrainedTokenizer":
        declared = "TokenizersBackend"
    name = str(config.get("_name_or_path") or "").lower()
    if _BACKEND_IDS.fullmatch(name):
        return "TokenizersBackend"
    registered = MODEL_TYPES.get(model_type) if model_type else None
    if declared is None:
        if model_type and registered is None:
            raise FastPathRefused(f"config.json's model_type {model_type!r} loads a tokenizer class hfcache does "
                                  "not replicate")
        return registered or "TokenizersBackend"
    if registered == "TokenizersBackend":  # what transformers loads for a generic model type, whatever is declared
        return registered
    if model_type and declared != registered:
        raise FastPathRefused(f"tokenizer_class {declared} and model_type {model_type!r}: transformers picks "
                              "between them by tables hfcache does not replicate")
    if declared not in GENERIC | REBUILT:
        raise FastPathRefused(f"tokenizer class {declared} rewrites the tokenizer on load in a way hfcache does "
                              "not replicate")
    return declared


def _added(value: Any) -> Any:
    """A tokenizer_config token (a string, or a serialized ``AddedToken`` dict) as tokenizers takes it."""
    from tokenizers import AddedToken

    if isinstance(value, dict):
        fields = {k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized", "special") if k in value}
        if not isinstance(value.get("content"), str) or not all(isinstance(v, bool) for v in fields.values()):
            raise FastPathRefused("a token in tokenizer_config.json is not a string or an AddedToken")
        return AddedToken(read.text(value["content"], "an added token's content"), **fields)
    if isinstance(value, str):
        return read.text(value, "a token")
    raise FastPathRefused("a token in tokenizer_config.json is not a string or an AddedToken")


def _token_settings(tk_config: dict, doc: dict, special_map: dict | None,
                    cls: str) -> tuple[list[int], list, dict, list]:
    """(the added tokens' ids and the added tokens in id order, named special token -> token, extra special tokens), as
    ``PreTrainedTokenizerBase._from_pretrained`` passes them (without ``added_tokens_decoder``: the legacy branch)."""
    from tokenizers import AddedToken

    settings = {**_DEFAULTS.get(cls, {}), **{k: tk_config[k] for k in SPECIAL_NAMES if k in tk_config}}
    decoder = tk_config.get("added_tokens_decoder")
    if decoder is None:
        for key, value in (special_map or {}).items():
            if key in SPECIAL_NAMES:
                settings[key] = {**value, "special": True} if isinstance(value, dict) else value
        where = "tokenizer.json's added_tokens"
        entries = {read.token_id(e.get("id"), where): {k: v for k, v in e.items() if k != "id"}
                   for e in read.entries(doc.get("added_tokens"), where)}
    elif isinstance(decoder, dict):
        entries = {read.token_id(k, "tokenizer_config.json's added_tokens_decoder"): v for k, v in decoder.items()}
    else:
        raise FastPathRefused("tokenizer_config.json's added_tokens_decoder is not an object")
    ordered = sorted(((i, _added(v)) for i, v in entries.items()), key=lambda pair: pair[0])
    added = [t if isinstance(t, AddedToken) else AddedToken(t) for _, t in ordered]
    added_ids = [i for i, _ in ordered]
    by_text = {str(t): t for t in added}
    named = {}
    for key, value in settings.items():
        if value is not None:
            token = _added(value)
            named[key] = by_text.get(str(token), token)
    extra = tk_config.get("extra_special_tokens", tk_config.get("additional_special_tokens")) or []
    if isinstance(extra, dict):
        raise FastPathRefused("model-specific extra_special_tokens are not replicated")
    if not isinstance(extra, list):
        raise FastPathRefused("extra special tokens are not a list")
    return added_ids, added, named, [_added(t) for t in extra]


def _vocab(doc: dict, kind: str) -> Any:
    model = doc["model"]  # an object: _json
    if kind and model.get("type") not in (None, kind):
        raise FastPathRefused(f"tokenizer.json's model is not a {kind} vocabulary")
    return read.vocabulary(model)


def _rebuild(cls: str, doc: dict, tk_config: dict) -> Any:
    """The backend a rebuilding class's ``__init__`` makes before ``TokenizersBackend.__init__`` runs."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE, WordPiece

    if cls == "BertTokenizer":
        unk = str(_added(tk_config.get("unk_token", "[UNK]")))
        tok = Tokenizer(WordPiece(_vocab(doc, "WordPiece"), unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=bool(read.flag(tk_config, "tokenize_chinese_chars", True)),
            strip_accents=read.flag(tk_config, "strip_accents", None),
            lowercase=bool(read.flag(tk_config, "do_lower_case", True)))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    elif cls == "LlamaTokenizer":
        tok = Tokenizer(BPE(vocab=_vocab(doc, "BPE"), merges=read.merges(doc["model"]), fuse_unk=True,
                            byte_fallback=True, dropout=None))
        prefix = read.flag(tk_config, "add_prefix_space", None)
        prefix = True if prefix is None else prefix
        scheme = ("first" if not read.flag(tk_config, "legacy", False) else "always") if prefix else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=False)
    else:  # GPT2Tokenizer
        tok = Tokenizer(BPE(vocab=_vocab(doc, "BPE"), merges=read.merges(doc["model"]), dropout=None,
                            continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=bool(read.flag(tk_config, "add_prefix_space", False)))
    return tok


def _same_added_tokens(tok: Any, added_ids: list[int], added: list) -> bool:
    """Whether the file's added tokens are exactly the ones the rebuild adds (ids, text and flags): then the file's
    parsed backend, retuned (:func:`_retune`: faster than building it from Python objects), is the rebuilt one."""
    def shape(t: Any) -> tuple:
        return (t.content, t.single_word, t.lstrip, t.rstrip, t.normalized, t.special)

    mine = sorted(tok.get_added_tokens_decoder().items())
    return [i for i, _ in mine] == added_ids and [shape(t) for _, t in mine] == [shape(t) for t in added]


def _retune(cls: str, tok: Any, doc: dict, tk_config: dict) -> Any:
    """The file's parsed backend set to what the class's ``__init__`` builds (:func:`_rebuild`): the same model
    arguments (every other one at its default), normalizer and pre-tokenizer; its post-processor is the file's."""
    from tokenizers import models

    kind = {"BertTokenizer": models.WordPiece}.get(cls, models.BPE)
    if not isinstance(tok.model, kind) or doc["model"].get("type") not in (None, kind.__name__):
        raise FastPathRefused(f"tokenizer.json's model is not a {kind.__name__} vocabulary")
    model, fresh = tok.model, _rebuild(cls, {"model": {"vocab": {}, "merges": []}}, tk_config)
    names = (("unk_token", "continuing_subword_prefix", "max_input_chars_per_word") if kind is models.WordPiece else
             ("unk_token", "dropout", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback",
              "ignore_merges"))
    for name in names:
        setattr(model, name, getattr(fresh.model, name))
    tok.normalizer, tok.pre_tokenizer = fresh.normalizer, fresh.pre_tokenizer
    return tok


def _file_parts(doc: dict) -> Any:
    """(post-processor, decoder) of the file, parsed beside an empty model: what ``convert_to_native_format`` reads
    (it parses the file without its vocabulary, or whole for a Unigram or untyped model: the same post-processor)."""
    from tokenizers import Tokenizer

    minimal = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
               "pre_tokenizer": None, "post_processor": doc.get("post_processor"), "decoder": doc.get("decoder"),
               "model": {"type": "WordLevel", "vocab": {}, "unk_token": "[UNK]"}}
    with library_call("tokenizer.json cannot be loaded"):
        parsed = Tokenizer.from_str(json.dumps(minimal))
    return parsed.post_processor, parsed.decoder


def _add_tokens(tok: Any, added: list, named: dict, extra: list) -> None:
    """``TokenizersBackend.__init__``'s additions: every added token in id order, then the named and extra special
    tokens not among them (as special tokens)."""
    from tokenizers import AddedToken

    encoder = {str(t) for t in tok.get_added_tokens_decoder().values()} | {str(t) for t in added}
    to_add = list(added)
    for token in (*named.values(), *extra):
        if str(token) not in encoder and token not in to_add:
            to_add.append(token)
    named_text = {str(t) for t in named.values()}
    tokens = []
    for token in to_add:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and str(token) in named_text:
            token.special = True
        tokens.append(token)
    if tokens:
        tok.add_tokens(tokens)


def _template(tok: Any, first: str | None, last: str | None) -> Any:
    """A ``TemplateProcessing`` ``first $A last`` (pair: ``first $A last $B:1 last:1``), as BERT's ``__init__`` and
    ``update_post_processor`` build it."""
    from tokenizers import processors

    ids = {}
    for token in filter(None, (first, last)):
        ids[token] = tok.token_to_id(token)
        if ids[token] is None:
            raise FastPathRefused(f"special token {token!r} is not in the vocabulary")
    single = " ".join(filter(None, (f"{first}:0" if first else None, "$A:0", f"{last}:0" if last else None)))
    pair = " ".join(filter(None, (single, "$B:1", f"{last}:1" if last else None)))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(ids.items()))


def _mistral_patch(tok: Any, config: dict | None) -> bool:
    """Whether transformers' ``_patch_mistral_regex`` rewrites this tokenizer's pre-tokenizer (offline branch)."""
    if tok.get_vocab_size() <= 100000 or tok.pre_tokenizer is None or config is None:
        return False
    model_type = config.get("model_type")
    return read.version_before_5(config.get("transformers_version")) and (model_type is None or
                                                                       model_type in _MISTRAL_TYPES)


def build(cache_dir: Path, repo_id: str, revision: str | None = None, repo_type: str = "model") -> FastTokenizer:
    """The fast tokenizer of ``repo_id@revision`` from the cache alone (no network, no transformers).

    Args:
        cache_dir (Path): the cache root; repo_id (str): as the application names it (a legacy id reads its own
            folder); revision (str | None): a ref name or a 40-hex commit [default: ``main``]; repo_type (str).

    Raises:
        NotCached: the repo, ref, snapshot is not in the cache.
        FastPathRefused: no ``tokenizer.json`` (a slow-only tokenizer), custom code, a class not replicated, a file
            too large or malformed, a setting of another type or out of bounds, a file the tokenizers library raises
            or panics on, at load or at a first encode (:func:`.fast_inputs.smoke_encode`).
        CacheError: a planted link or FIFO on the way (UnsafeLayout), a file or folder this user cannot read.
    """
    folder = safefs.check_folder_name(repo_folder_name(repo_id, repo_type))
    _must_exist(cache_dir, (folder,), f"{repo_id} is not in the cache (no {folder}/)")
    commit = resolve_commit(cache_dir, folder, revision or "main")
    tk_config = _read_json(cache_dir, folder, commit, "tokenizer_config.json") or {}
    config = _read_json(cache_dir, folder, commit, "config.json")
    cls = resolve_class(tk_config, config)
    raw = _read(cache_dir, folder, commit, "tokenizer.json", MAX_TOKENIZER_JSON)
    if raw is None:
        raise FastPathRefused("no tokenizer.json in the snapshot (a slow-only tokenizer: transformers converts its "
                              "vocabulary files on load)")
    if _read(cache_dir, folder, commit, "added_tokens.json", MAX_CONFIG_JSON) is not None:
        raise FastPathRefused("added_tokens.json (a legacy added-token file) is not replicated")
    doc = _json(raw, "tokenizer.json")
    read.growth(doc)  # a chain that can blow a text up is refused before the library builds it
    if cls == "LlamaTokenizer" and b'"ByteLevel"' in raw:
        cls = "TokenizersBackend"  # AutoTokenizer loads a byte-level "LlamaTokenizer" as TokenizersBackend
    special_map = None
    if "added_tokens_decoder" not in tk_config:
        special_map = _read_json(cache_dir, folder, commit, "special_tokens_map.json")
    tok = _set_up(raw, doc, cls, tk_config, config, special_map)
    smoke_encode(tok)
    return FastTokenizer(tok, commit, cls)


def _set_up(raw: bytes, doc: dict, cls: str, tk_config: dict, config: dict | None, special_map: dict | None) -> Any:
    """The ``tokenizers.Tokenizer`` of ``raw`` set up as ``cls``'s load sets it up (what the library raises or panics
    on, once the settings are checked, is a refusal)."""
    from tokenizers import Tokenizer

    with library_call("tokenizers refuses this repo's added tokens"):  # AddedToken() is the library's too
        added_ids, added, named, extra = _token_settings(tk_config, doc, special_map, cls)
    split = bool(read.flag(tk_config, "split_special_tokens", False))
    with library_call("tokenizer.json cannot be loaded"):
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    with library_call("tokenizers refuses this repo's tokenizer settings"):
        if cls in REBUILT and _same_added_tokens(tok, added_ids, added):
            tok = _retune(cls, tok, doc, tk_config)
        elif cls in REBUILT:
            tok = _rebuild(cls, doc, tk_config)
            # The decoder is the file's (decode is best effort: the promise is encode's ids; a rebuilt backend had
            # none, so GPT-2 decoded to 'Hello , Ġworld !')
            tok.post_processor, tok.decoder = _file_parts(doc)
        # With a tokenizer.json, _from_pretrained drops add_bos_token/add_eos_token from tokenizer_config: the
        # template is rebuilt (with neither) only when the file has no post-processor.
        update = tok.post_processor is None
        tok.no_truncation()  # AutoTokenizer's __call__ neither truncates nor pads by default (nor may a padding of
        tok.no_padding()  # 2**58 ids abort the process at the smoke encode: fast_inputs)
        _add_tokens(tok, added, named, extra)
        tok.encode_special_tokens = split
        _finish(tok, cls, named, config, update)
    return tok


def _finish(tok: Any, cls: str, named: dict, config: dict | None, update: bool) -> None:
    """The end of ``TokenizersBackend.__init__`` (the Mistral regex patch: refused; the ``$A`` template when the
    file had no post-processor), then BERT's template (its ``__init__`` sets it last)."""
    if _mistral_patch(tok, config):
        raise FastPathRefused("transformers rewrites this tokenizer's pre-tokenizer regex on load (its Mistral "
                              "regex patch), which hfcache does not replicate")
    if cls == "BertTokenizer":
        if not named.get("cls_token") or not named.get("sep_token"):
            raise FastPathRefused("a BertTokenizer without a cls_token or sep_token is not replicated")
        tok.post_processor = _template(tok, str(named["cls_token"]), str(named["sep_token"]))
    elif update:
        tok.post_processor = _template(tok, None, None)
