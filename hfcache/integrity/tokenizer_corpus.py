"""tokenizer_corpus: the text ``hfcache check`` encodes with both backends to prove the fast path equal.

Lines where tokenizers' load-time rewrites show: scripts a normalizer or pre-tokenizer treats apart (CJK, Arabic,
Devanagari, Cyrillic, Hangul), accents composed and decomposed (``strip_accents``, lowercasing), emoji with ZWJ
sequences (byte fallback), whitespace runs and the empty string (``add_prefix_space``, Metaspace), invisible
characters; then :func:`corpus`'s.
"""

from __future__ import annotations

from collections.abc import Iterable

BASE: tuple[str, ...] = (
    "Hello world, 深度学习技术正在改变世界",
    "日本語のテキスト、カタカナとひらがな。한국어 문장도 있습니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "Привет, мир! Ёлка и ёж.",
    "Café naïve résumé façade",
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "Ångström ÅNGSTRÖM straße STRASSE İstanbul",
    "emoji 😀🎉 👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🏳️\u200d🌈",
    "   leading spaces and  double  spaces   ",
    "tabs\tand\t\ttabs\nnew\nlines\n\n\r\nwindows",
    "",
    " ",
    "\n",
    "UPPER lower MiXeD 12345 3.14159 $100 #hashtag @user",
    "https://example.com/path?query=1&x=y",
    "def f(x):\n    return x ** 2  # code",
    "don't won't it's 'quoted' \"double\"",
    "\u200b zero\u200dwidth \ufeff bom \u00a0nbsp \u3000ideographic space",
)

#: Words in the long line: over 8,192 tokens for every fixture, past every ``model_max_length`` (neither backend
#: truncates).
LONG_WORDS = 9000


def corpus(special_tokens: Iterable[str] = ()) -> list[str]:
    """The lines to compare: :data:`BASE`, the repo's ``special_tokens`` (special and added token strings, at most
    64 in the order given) alone, spaced and glued to words (how added tokens split, ``lstrip``/``rstrip``), then a
    long line."""
    lines = list(BASE)
    tokens = [t for t in dict.fromkeys(special_tokens) if t][:64]
    if tokens:
        lines.append(" ".join(tokens))
        lines.append("a" + "".join(tokens) + "b")
        lines.extend(f"x {t} y{t}z" for t in tokens[:16])
    lines.append(" ".join(["tokens"] * (LONG_WORDS // 2) + ["日本"] * (LONG_WORDS // 2)))
    return lines
