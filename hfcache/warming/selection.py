"""Which files of a repo to fetch: the tokenizer set, a model in one weight format, or everything.

Pure functions over a repo's file listing; no network, no filesystem. Some selections need file contents to finish
(:attr:`Selection.needs_index`, :attr:`Selection.needs_config`): the caller fetches and hash-checks those files and
passes their bytes to :func:`shards_from_index` / :func:`follow_configs` (custom code named by ``auto_map``, parsed
with ``ast`` and never executed; sentence-transformers module folders named by ``modules.json``).

The tokenizer file names come from transformers 5.x: ``tokenization_utils_base.py`` (``tokenizer_config.json``,
``special_tokens_map.json``, ``added_tokens.json``, ``tokenizer.json``, ``chat_template.jinja``,
``chat_template.json``, ``additional_chat_templates/``), the per-class ``vocab_files_names`` of the tokenizers
(``vocab.txt``, ``vocab.json``, ``merges.txt``, SentencePiece ``*.model``, tiktoken files, Mistral ``tekken.json``),
and ``AutoTokenizer`` reading ``config.json`` to pick the class (``models/auto/tokenization_auto.py``).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..records import KINDS, UnsafePath, validate_repo_path

#: Root-level names a tokenizer load may ask for. When the repo lacks one of them at a commit, warm writes the
#: ``.no_exist/<commit>/<name>`` marker so an offline load knows it is absent instead of failing (DESIGN §3).
TOKENIZER_FILENAMES: tuple[str, ...] = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "merges.txt",
    "special_tokens_map.json",
    "tekken.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)

#: Root-level globs for vocab files whose names vary by model family.
TOKENIZER_GLOBS: tuple[str, ...] = (
    "*.model",  # SentencePiece: spiece.model, sentencepiece.bpe.model, tokenizer.model, ...
    "*.spm",  # Marian source.spm / target.spm
    "*.tiktoken",  # tiktoken BPE ranks (qwen.tiktoken, cl100k_base.tiktoken)
    "tiktoken.model",
    "tokenizer.model.v*",  # Mistral's versioned SentencePiece files (tokenizer.model.v3)
    "vocab.*",  # vocab.bpe, vocab.model, ...
    "spiece.*",
    "*.vocab",
    "additional_chat_templates/*.jinja",
)

#: Weight formats, in order of preference for ``kind="model"``: (index file, single file, glob).
_WEIGHT_FORMATS: tuple[tuple[str, str, str], ...] = (
    ("model.safetensors.index.json", "model.safetensors", "*.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin", "*.bin"),
)

#: Weight files of every format. ``kind="model"`` skips them unless they belong to the chosen format or an
#: ``include`` glob asks for them (the TF/Flax/ONNX/GGUF/... duplicates of a model).
WEIGHT_GLOBS: tuple[str, ...] = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.onnx_data",
    "*.ot", "*.gguf", "*.ggml", "*.tflite", "*.mlmodel", "*.npz", "*.pb", "*.keras", "*.pdparams",
)

#: Folders that hold other runtimes' exports; skipped by ``kind="model"``.
_EXPORT_DIRS: tuple[str, ...] = ("onnx/", "openvino/", "coreml/", "tflite/", "tf/", "flax/", "gguf/", "mlx/")

#: Small text files a model load reads besides its weights (configs, custom code, processor files).
_MODEL_SIDE_GLOBS: tuple[str, ...] = ("*.json", "*.py", "*.txt", "*.jinja", "*.yaml", "*.yml")


@dataclass(frozen=True)
class Selection:
    """The outcome of selecting files from a listing.

    Attributes:
        paths (tuple[str, ...]): repo paths to fetch, sorted.
        absent (tuple[str, ...]): optional tokenizer names the repo does not have (``.no_exist`` markers), sorted.
        needs_index (tuple[str, ...]): sharded weight index files whose ``weight_map`` must be read to finish
            the selection (see :func:`shards_from_index`); empty when the selection is complete.
        needs_config (tuple[str, ...]): config files to read to finish the selection (see :func:`follow_configs`):
            ``tokenizer_config.json``/``config.json`` whose ``auto_map`` may name custom code (a module the repo
            lacks too: it gets a ``.no_exist`` marker), and for ``kind="model"`` a sentence-transformers ``modules.json`` naming module folders;
            empty when the kind selects every file.
    """

    paths: tuple[str, ...]
    absent: tuple[str, ...]
    needs_index: tuple[str, ...] = ()
    needs_config: tuple[str, ...] = ()


def _match(path: str, patterns: Iterable[str]) -> bool:
    """fnmatch a repo path against globs; a pattern ending in ``/`` matches a whole folder.

    Same rule as ``huggingface_hub.utils.filter_repo_objects`` (``utils/_paths.py``).
    """
    for pattern in patterns:
        if pattern.endswith("/"):
            pattern += "*"
        if fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def _is_root(path: str) -> bool:
    return "/" not in path


def tokenizer_paths(paths: Iterable[str]) -> set[str]:
    """Return the paths a tokenizer load can need, from all the repo's paths."""
    chosen = set()
    for path in paths:
        if _is_root(path) and (path in TOKENIZER_FILENAMES or _match(path, TOKENIZER_GLOBS)):
            chosen.add(path)
        elif path.startswith("additional_chat_templates/") and path.endswith(".jinja"):
            chosen.add(path)
    # A root "*.model"/"vocab.*" glob can catch weights ("vocab.bin" is rare, "model.bin" is not matched).
    return {p for p in chosen if not _match(p, WEIGHT_GLOBS)}


def _weight_paths(paths: set[str]) -> tuple[set[str], tuple[str, ...]]:
    """Pick root weights in one format: safetensors when present, else PyTorch ``.bin``.

    Returns ``(paths, index_files)``: when a sharded index exists, the shards are known only after reading
    it, so the index is returned for :func:`shards_from_index` and no shard is guessed.
    """
    root = {p for p in paths if _is_root(p)}
    for index_name, single_name, glob in _WEIGHT_FORMATS:
        if index_name in root:
            return {index_name}, (index_name,)
        if single_name in root:
            return {single_name}, ()
        candidates = {p for p in root if fnmatch.fnmatchcase(p, glob) and p != "training_args.bin"}
        if candidates:
            return candidates, ()
    return set(), ()


def select(
    paths: Iterable[str],
    kind: str = "tokenizer",
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Selection:
    """Select the files of one repo listing.

    Args:
        paths: every file path of the repo at one commit (``/``-separated, relative to the repo root).
        kind: ``"tokenizer"`` (tokenizer files plus ``config.json``), ``"model"`` (tokenizer files, configs,
            custom code and the weights in ONE format, safetensors first) or ``"all"`` (every file).
        include: globs whose matches are added to the kind's selection (e.g. ``"onnx/*"``).
        exclude: globs whose matches are never selected; exclude wins over include.

    Returns:
        Selection: the paths to fetch, the absent optional tokenizer names, and index files to follow.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    all_paths = set(paths)
    needs_index: tuple[str, ...] = ()
    if kind == "all":
        chosen = set(all_paths)
    else:
        chosen = tokenizer_paths(all_paths)
        if kind == "model":
            side = {
                p for p in all_paths
                if _match(p, _MODEL_SIDE_GLOBS) and not p.startswith(_EXPORT_DIRS)
            }
            weights, needs_index = _weight_paths(all_paths)  # root weights; module folders: follow_configs
            chosen |= side | weights
    chosen |= {p for p in all_paths if include and _match(p, include)}
    chosen = {p for p in chosen if not (exclude and _match(p, exclude))}
    # Markers for every kind: a tokenizer load from a "model" or "all" warm needs them just the same.
    absent = tuple(sorted(n for n in TOKENIZER_FILENAMES if n not in all_paths))
    needs_index = tuple(i for i in needs_index if i in chosen)
    needs_config: tuple[str, ...] = ()
    if kind != "all":
        needs_config = tuple(c for c in AUTO_MAP_FILES if c in chosen)
        if kind == "model" and MODULES_FILE in chosen:
            needs_config += (MODULES_FILE,)
    return Selection(paths=tuple(sorted(chosen)), absent=absent, needs_index=needs_index, needs_config=needs_config)


#: Largest sharded weight index read into memory, bytes (real ones are about 1 MiB at most); checked against the size
#: the endpoint publishes before the index is fetched.
MAX_INDEX_BYTES = 64 * 1024 * 1024


def check_index_size(index_path: str, size: int) -> None:
    """Raise ValueError when an index of ``size`` bytes (as published) is larger than ``MAX_INDEX_BYTES``."""
    if size > MAX_INDEX_BYTES:
        raise ValueError(f"{index_path} is {size} bytes, more than the {MAX_INDEX_BYTES} a sharded weight index "
                         "may have")


def shards_from_index(index_bytes: bytes, available: Iterable[str], index_path: str) -> set[str]:
    """Return the shard paths a sharded ``*.index.json`` names in its ``weight_map``.

    Args:
        index_bytes: the content of the index file (JSON with a ``weight_map`` of tensor name -> shard file).
        available: every path of the repo, to resolve shards relative to the index's folder.
        index_path: the index's own repo path.

    Returns:
        set[str]: shard paths, relative to the repo root.

    Raises:
        ValueError: the index is not JSON with a ``weight_map`` object, or names a shard the repo does not have.
    """
    try:
        weight_map = json.loads(index_bytes)["weight_map"]
        shard_names = set(weight_map.values())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as exc:
        raise ValueError(f"{index_path} is not a sharded weight index: {type(exc).__name__} {exc}") from None
    odd = sorted(repr(n) for n in shard_names if not isinstance(n, str) or not n)
    if odd:
        raise ValueError(f"{index_path} is not a sharded weight index: its weight_map names {odd[0]}, not a file name")
    folder = index_path.rsplit("/", 1)[0] + "/" if "/" in index_path else ""
    shards = {folder + name for name in shard_names}
    missing = sorted(shards - set(available))
    if missing:
        raise ValueError(f"{index_path} names shards the repo does not have: {', '.join(missing[:3])}")
    return shards


#: Root files whose ``auto_map`` names the custom code a load runs, and the ``auto_map`` keys that matter for a
#: tokenizer load (transformers 5.24: ``models/auto/tokenization_auto.py`` takes ``AutoTokenizer`` from
#: ``tokenizer_config.json`` (a dict entry, or the legacy list form), and first loads the config through
#: ``AutoConfig``, which runs ``config.json``'s ``auto_map["AutoConfig"]`` (``models/auto/configuration_auto.py``)).
#: ``config.json``'s ``AutoTokenizer`` is read by transformers 4.x; it is followed too.
AUTO_MAP_FILES: tuple[str, ...] = ("tokenizer_config.json", "config.json")
#: Configs and code files larger than this are not parsed for ``auto_map`` or imports (a hostile repo's 5 GB
#: "config.json" must not be read into memory); readers passed to :func:`custom_code_paths` return None then, and the
#: file is reported in :attr:`CustomCode.unparsed`.
MAX_PARSE_BYTES = 16 * 1024 * 1024
_TOKENIZER_AUTO_KEYS = {"tokenizer_config.json": ("AutoTokenizer",), "config.json": ("AutoConfig", "AutoTokenizer")}


def auto_map_refs(config_path: str, config_bytes: bytes, kind: str = "tokenizer") -> tuple[str, ...]:
    """The class references (``module.ClassName``, or ``org/repo--module.ClassName``) a config's ``auto_map`` names.

    Args:
        config_path (str): ``tokenizer_config.json`` or ``config.json`` (selects the keys that matter).
        config_bytes (bytes): the file's content. Not JSON, or no ``auto_map``: no reference.
        kind (str): ``tokenizer``: only the keys a tokenizer load uses (:data:`AUTO_MAP_FILES`); other kinds: every
            key (``AutoModel...`` too).

    Returns:
        tuple[str, ...]: references in file order, without duplicates or ``null`` entries.

    Raises:
        RepoDataError: the file is JSON nested too deeply for Python's parser (transformers cannot load it either);
            a file that is simply not JSON (or not an object) has no reference.
    """
    try:
        auto_map = json.loads(config_bytes).get("auto_map")
    except (ValueError, AttributeError, TypeError, OverflowError):
        return ()
    except RecursionError:
        raise RepoDataError(f"{config_path} is JSON nested too deeply to parse") from None
    if isinstance(auto_map, list):  # legacy tokenizer_config form: [slow, fast]
        auto_map = {"AutoTokenizer": auto_map}
    if not isinstance(auto_map, dict):
        return ()
    keys = _TOKENIZER_AUTO_KEYS.get(config_path, ()) if kind == "tokenizer" else tuple(auto_map)
    refs: list[str] = []
    for key in keys:
        value = auto_map.get(key)
        for ref in value if isinstance(value, list) else [value]:
            if isinstance(ref, str) and ref and ref not in refs:
                refs.append(ref)
    return tuple(refs)


def module_path(class_ref: str) -> str | None:
    """The repo path of the module a class reference lives in, as transformers derives it
    (``dynamic_module_utils.get_class_from_dynamic_module``: ``module_file, class_name = ref.split(".")``, then
    ``module_file + ".py"``); None for a reference into another repo (``org/repo--module.Class``: that repo must be
    warmed itself) or one transformers could not load either (not exactly ``module.Class``, or an unsafe path).
    """
    if "--" in class_ref:
        return None
    parts = class_ref.split(".")
    if len(parts) != 2 or not all(parts):
        return None
    try:
        return validate_repo_path(parts[0] + ".py")
    except UnsafePath:
        return None


#: transformers 5.24 ``dynamic_module_utils.get_relative_imports``: the two regexes it runs over a code file's text
#: (a docstring or comment line that looks like an import counts too, so transformers fetches that module as well):
#: ``^\s*import\s+\.(\S+)\s*$`` and ``^\s*from\s+\.(\S+)\s+import`` (MULTILINE). Their leading ``^\s*`` may span
#: blank lines, which makes them quadratic on a file of blank lines (40,000 lines: 34 s); here it is ``[^\S\n]*``
#: (no newline): the same captures, since a match that starts lines earlier also matches from its own line start.
_RELATIVE_IMPORT_RES = (re.compile(r"^[^\S\n]*import\s+\.(\S+)\s*$", re.MULTILINE),
                        re.compile(r"^[^\S\n]*from\s+\.(\S+)\s+import", re.MULTILINE))


def relative_imports(source: bytes, path: str) -> tuple[str, ...]:
    """The repo paths of the modules a custom-code file imports relatively (never executed).

    transformers copies them into its modules cache beside the file: ``dynamic_module_utils.get_relative_imports``
    matches the text with :data:`_RELATIVE_IMPORT_RES` (``from .NAME import ...`` becomes ``<folder>/NAME.py``, NAME
    taken literally, dots included: ``from ..up import`` asks for ``.up.py``), and ``get_cached_module_file`` fetches
    each. That rule is restated here, united with an ``ast`` walk (``from .NAME import`` statements the regexes miss,
    e.g. after ``;``). Names that are not safe repo paths are dropped (transformers' fetch of them fails anyway).
    """
    text = source.decode("utf-8", errors="replace")
    names = [m.group(1) for regex in _RELATIVE_IMPORT_RES for m in regex.finditer(text)]
    try:
        tree = ast.parse(source, filename=path)
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass  # the regexes still apply: transformers reads the text the same way before the import fails
    folder = posixpath.dirname(path)
    found: set[str] = set()
    for name in names:
        try:
            found.add(validate_repo_path(posixpath.join(folder, name + ".py")))
        except UnsafePath:
            continue
    return tuple(sorted(found))


@dataclass(frozen=True)
class CustomCode:
    """The custom code a repo's configs name.

    Attributes:
        paths (tuple[str, ...]): Python files of the repo to fetch: the modules ``auto_map`` names and, recursively,
            the modules they import relatively; sorted.
        absent (tuple[str, ...]): files named that way which the repo does not have (``.no_exist`` markers: an
            offline load then fails at once with "no file named" instead of "couldn't connect"); sorted.
        foreign (tuple[str, ...]): class references into other repos (``org/repo--module.Class``); not fetched.
        unparsed (tuple[str, ...]): configs and code files larger than :data:`MAX_PARSE_BYTES`, not read: the
            ``auto_map`` or relative imports in them are not followed (the caller warns).
    """

    paths: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    foreign: tuple[str, ...] = ()
    unparsed: tuple[str, ...] = ()


def foreign_repos(refs: Iterable[str]) -> tuple[str, ...]:
    """The repo ids of class references into other repos (``org/repo--module.Class`` -> ``org/repo``), sorted."""
    return tuple(sorted({r.split("--", 1)[0] for r in refs if "--" in r}))


def custom_code_paths(configs: Iterable[str], read: Callable[[str], bytes | None], available: Iterable[str],
                      kind: str = "tokenizer", exclude: Sequence[str] = ()) -> CustomCode:
    """Follow ``auto_map`` from the configs to the Python files a load runs, without executing any of them.

    Args:
        configs: config paths to read (:attr:`Selection.needs_config`).
        read: returns a repo file's bytes (the caller fetches it first when needed), or None for a file larger than
            :data:`MAX_PARSE_BYTES` (not parsed); only called on paths of ``available``.
        available: every path of the repo at the commit.
        kind: as :func:`auto_map_refs`.
        exclude: globs never fetched (``--exclude`` wins here too; an excluded file gets no marker either).

    Returns:
        CustomCode.

    Raises:
        RepoDataError: a config nested too deeply to parse (:func:`auto_map_refs`).
    """
    have = set(available)
    unparsed: list[str] = []

    def parse(path: str, parser: Callable[[bytes], Iterable[str]]) -> list[str]:
        data = read(path)
        if data is None:
            unparsed.append(path)
            return []
        return list(parser(data))

    refs = [ref for config in configs if config in have
            for ref in parse(config, lambda data, c=config: auto_map_refs(c, data, kind))]
    queue = sorted({m for m in (module_path(r) for r in refs) if m})
    seen: set[str] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        if path in have and not (exclude and _match(path, exclude)):
            queue.extend(p for p in parse(path, lambda data, p=path: relative_imports(data, p)) if p not in seen)
    kept = {p for p in seen if not (exclude and _match(p, exclude))}
    return CustomCode(paths=tuple(sorted(kept & have)), absent=tuple(sorted(kept - have)),
                      foreign=tuple(sorted({r for r in refs if "--" in r})), unparsed=tuple(sorted(unparsed)))


#: sentence-transformers' list of modules (``SentenceTransformer._load_sbert_model``): each ``{"path": folder}`` is
#: loaded from that folder (``""`` or ``"."``: the repo root), e.g. ``1_Pooling/config.json``,
#: ``2_Dense/model.safetensors``, ``0_StaticEmbedding/{model.safetensors,tokenizer.json}`` (model2vec/static models).
MODULES_FILE = "modules.json"


def module_folder_paths(modules_bytes: bytes, available: Iterable[str]) -> tuple[set[str], tuple[str, ...]]:
    """The files a sentence-transformers load reads from the module folders ``modules.json`` names: per folder, its
    tokenizer files, its small side files (configs, ``*.txt``...) and its weights in ONE format (safetensors first,
    as at the root).

    Args:
        modules_bytes: the content of ``modules.json`` (a JSON list of ``{"path": ...}``). Not that: nothing.
        available: every path of the repo.

    Returns:
        ``(paths, index_files)``: repo paths, and sharded index files in module folders to follow with
        :func:`shards_from_index`.

    Raises:
        RepoDataError: ``modules.json`` is nested too deeply to parse (sentence-transformers cannot load it either).
    """
    try:
        modules = json.loads(modules_bytes)
        folders = [m["path"] for m in modules if isinstance(m, dict) and isinstance(m.get("path"), str)]
    except (ValueError, TypeError, OverflowError):
        return set(), ()
    except RecursionError:
        raise RepoDataError(f"{MODULES_FILE} is JSON nested too deeply to parse") from None
    have = set(available)
    chosen: set[str] = set()
    indexes: list[str] = []
    for folder in folders:
        folder = folder.strip("/")
        if folder in ("", "."):
            continue  # the root: selected by select() already
        try:
            validate_repo_path(folder)
        except UnsafePath:
            continue
        inside = {p[len(folder) + 1:] for p in have if p.startswith(folder + "/")}
        weights, index_files = _weight_paths(inside)
        side = {p for p in inside if _match(p, _MODEL_SIDE_GLOBS) and not p.startswith(_EXPORT_DIRS)}
        chosen |= {f"{folder}/{p}" for p in tokenizer_paths(inside) | side | weights}
        indexes += [f"{folder}/{i}" for i in index_files]
    return chosen, tuple(indexes)


@dataclass(frozen=True)
class Followed:
    """What reading a selection's :attr:`Selection.needs_config` adds: ``paths`` to fetch, ``absent`` names to mark
    (``.no_exist``), ``needs_index`` sharded indexes to follow next, ``foreign`` custom-code references into other
    repos (not fetched), ``unparsed`` files too large to parse (:attr:`CustomCode.unparsed`)."""

    paths: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    needs_index: tuple[str, ...] = ()
    foreign: tuple[str, ...] = ()
    unparsed: tuple[str, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """One-line warnings for the report: code in other repos, files not parsed."""
        notes = [f"custom code in {repo}: warm it too" for repo in foreign_repos(self.foreign)]
        notes += [f"{path} is larger than {MAX_PARSE_BYTES} bytes: not parsed, the custom code it names or imports "
                  "is not fetched" for path in self.unparsed]
        return tuple(notes)


def follow_configs(needs_config: Sequence[str], read: Callable[[str], bytes | None], available: Iterable[str],
                   kind: str = "tokenizer", exclude: Sequence[str] = ()) -> Followed:
    """Finish a selection from the configs it needs (:attr:`Selection.needs_config`): custom code named by
    ``auto_map`` (:func:`custom_code_paths`) and sentence-transformers module folders (:func:`module_folder_paths`).

    Args:
        needs_config: the configs to read.
        read: returns a repo file's bytes (the caller fetches and hash-checks it first), None above
            :data:`MAX_PARSE_BYTES`; only called on available paths.
        available: every path of the repo at the commit.
        kind: the selection's kind.
        exclude: globs never selected (as in :func:`select`).

    Returns:
        Followed.

    Raises:
        RepoDataError: a config nested too deeply to parse; the message names the file.
    """
    have = set(available)
    code = custom_code_paths([c for c in needs_config if c in AUTO_MAP_FILES], read, have, kind, exclude)
    modules: set[str] = set()
    indexes: tuple[str, ...] = ()
    unparsed = code.unparsed
    if MODULES_FILE in needs_config and MODULES_FILE in have:
        data = read(MODULES_FILE)
        if data is None:
            unparsed += (MODULES_FILE,)
        else:
            modules, indexes = module_folder_paths(data, have)
    keep = {p for p in modules | set(code.paths) if not (exclude and _match(p, exclude))}
    return Followed(paths=tuple(sorted(keep)), absent=code.absent,
                    needs_index=tuple(i for i in indexes if i in keep), foreign=code.foreign, unparsed=unparsed)


class RepoDataError(ValueError):
    """A repo file hfcache must parse (a config, ``modules.json``, a sharded index) that no parser can read: nested
    too deeply, wrong types. The message names the file; callers add the repo id."""


def file_folder_conflict(paths: Iterable[str]) -> str | None:
    """The first path (sorted) that a listing names both as a file and as a folder of another file, else None.

    Such a listing cannot be laid out in a snapshot (``a`` cannot be a link and a folder at once): it is refused
    before anything is downloaded or published, so a failed warm leaves nothing behind.
    """
    names = set(paths)
    for path in sorted(names):
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in names:
                return prefix
    return None
