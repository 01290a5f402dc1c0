"""Turning bytes of unknown or mislabelled charset into text, never failing.

Mail in the wild declares charsets wrongly (GBK text labelled ``gb2312``, UTF-8 labelled
``iso-8859-1``), not at all (8-bit headers), or with names Python does not know. The order:

1. The declared charset, widened to the superset real mailers actually use
   (``gb2312``/``gbk`` -> ``gb18030``, ``big5`` -> ``cp950``/``big5hkscs``,
   ``shift_jis`` -> ``cp932``, ``euc-kr`` -> ``cp949``, ``iso-2022-jp`` -> ``iso2022_jp_2``,
   ``iso-8859-1``/``us-ascii`` -> ``cp1252``), decoded strictly. A single-byte declaration
   loses to UTF-8 when the bytes are valid UTF-8 (a classic mislabel; valid multi-byte UTF-8
   sequences practically never occur in real Latin-1 text).
2. Strict UTF-8.
3. A small heuristic: strict decoding with gb18030, cp950, cp932, cp949 and cp1252, each
   result (of the first 8 KiB) scored by how plausible its characters are (very common Chinese characters,
   kana, hangul and accented Latin letters score, rare symbols and controls cost); the
   best score wins, ties go to the earlier candidate. No dependency (charset-normalizer or
   chardet) is needed for the cases mail actually has: mostly CJK without a label.
4. cp1252 with replacement characters, which cannot fail.

Codecs that are not plain charsets (``punycode``, ``idna``, ``unicode_escape`` ...) are
never used, whatever a mail declares: some are slow on crafted input.

>>> decode_text("会议通知".encode("gbk"), "gb2312")
'会议通知'
>>> decode_text("會議通知".encode("big5"), None)
'會議通知'
>>> decode_text("Grüße".encode("utf-8"), "iso-8859-1")
'Grüße'
"""

from __future__ import annotations

import codecs
import unicodedata
from functools import lru_cache

__all__ = ["clean_text", "decode_text", "normalize_charset"]

# Declared name -> codecs to try, in order (supersets first: they decode the subset too).
_WIDEN: dict[str, tuple[str, ...]] = {
    "gb2312": ("gb18030",),
    "gbk": ("gb18030",),
    "cp936": ("gb18030",),
    "euc_cn": ("gb18030",),
    "gb18030": ("gb18030",),
    "big5": ("cp950", "big5hkscs"),
    "cp950": ("cp950", "big5hkscs"),
    "big5hkscs": ("big5hkscs", "cp950"),
    "shift_jis": ("cp932", "shift_jis_2004"),
    "cp932": ("cp932", "shift_jis_2004"),
    "euc_jp": ("euc_jis_2004", "euc_jp"),
    "iso2022_jp": ("iso2022_jp_2", "iso2022_jp_ext"),
    "euc_kr": ("cp949",),
    "cp949": ("cp949",),
    "ascii": ("cp1252",),
    "latin_1": ("cp1252",),
    "iso8859_1": ("cp1252",),
}

# Never trust a mail to choose these: not charsets, or quadratic on crafted input.
_FORBIDDEN = frozenset(
    {"punycode", "idna", "unicode_escape", "raw_unicode_escape", "undefined", "mbcs", "oem"}
)

_STATEFUL_7BIT = frozenset(
    {"iso2022_jp", "iso2022_jp_1", "iso2022_jp_2", "iso2022_jp_3", "iso2022_jp_ext"}
    | {"iso2022_jp_2004", "iso2022_kr", "utf-7", "hz"}
)

_SAMPLE_BYTES = 8192
_HEURISTIC_CANDIDATES = ("gb18030", "cp950", "cp932", "cp949", "cp1252")

# The most frequent Chinese characters (simplified and traditional forms). Decoding Big5
# bytes as GBK (or the reverse) gives valid but improbable characters; real text hits these.
_COMMON_HAN = frozenset(
    "的一是不了在人有我他这個个们們中来來上大为為和国國地到以说說时時要就出会會可也你对對生能而"
    "子那得于於着著下自之年过過发發后後作里裡用道行所然家种種事成方多经經么麼去法学學如都同现現"
    "当當没沒动動面起看定天分还還进進好小部其些主样樣理心她本前开開但因只从從想实實日月本文件通"
    "知议議请請问問题題新公司工资資价價格单單报報告表明天今客户戶服务務电電话話邮郵箱信息订訂货貨"
    "款项項目合同收付发票付款会议議时間间时候再见見谢謝您好的吗嗎呢吧啊最已经很更被把让讓给給向"
    "与與及或等每各几幾两兩第期号號件附通知确確认認联聯系係网網站址内內容"
)
# The same idea for hangul: cp949 maps almost any pair of high bytes to some syllable.
_COMMON_HANGUL = frozenset(
    "이다는의하에가을를고서지기사니요세안녕회정한대수습로으도일있시자나해어인리주전보내우용장제부문경거게"
    "감합확께드립것및관련메일첨파신청결과계약번호"
)


def normalize_charset(name: str | None) -> str | None:
    """The codec name Python uses for a declared charset, or None when unusable.

    >>> normalize_charset(' "UTF-8" '), normalize_charset("x-unknown"), normalize_charset("punycode")
    ('utf-8', None, None)
    """
    if not name:
        return None
    # RFC 2231 allows a language suffix: charset*language.
    cleaned = name.strip().strip("\"'").split("*", 1)[0].strip().lower()
    if not cleaned or len(cleaned) > 40:
        return None
    return _lookup(cleaned)


@lru_cache(maxsize=256)
def _lookup(cleaned: str) -> str | None:
    try:
        info = codecs.lookup(cleaned)
    except (LookupError, ValueError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name.replace("-", "_") in _FORBIDDEN:
        return None
    return info.name


def _candidates_for(declared: str) -> tuple[str, ...]:
    return _WIDEN.get(declared.replace("-", "_"), (declared,))


def _is_single_byte(codec: str) -> bool:
    return codec in ("ascii", "latin-1", "iso8859-1", "cp1252") or codec.startswith(
        ("iso8859", "cp125", "cp437", "cp850", "koi8", "mac")
    )


def decode_text(data: bytes, declared: str | None, *, partial: bool = False) -> str:
    """Decode ``data``; never raises. See the module docstring for the order.

    ``partial=True`` says ``data`` is a prefix cut at an arbitrary byte: an incomplete
    character at the end is dropped instead of disqualifying the charset.
    """
    if declared is None and data.isascii() and b"\x1b$" not in data:
        return data.decode("ascii")  # most header values: what the branch below returns
    codec = normalize_charset(declared)
    if data.isascii():
        # 7-bit charsets with escape sequences (ISO-2022-JP is still common in Japan).
        if codec in _STATEFUL_7BIT or (codec is None and b"\x1b$" in data):
            for candidate in _candidates_for(codec or "iso2022_jp"):
                text = _try_decode(data, candidate, partial)
                if text is not None:
                    return text
        return data.decode("ascii")
    if codec is not None and codec not in ("utf-8", "utf-8-sig"):
        if _is_single_byte(codec):
            utf8 = _try_decode(data, "utf-8", partial)
            if utf8 is not None:
                return utf8
        for candidate in _candidates_for(codec):
            text = _try_decode(data, candidate, partial)
            if text is not None:
                return text
    utf8 = _try_decode(data, "utf-8", partial)
    if utf8 is not None:
        return utf8
    # Rank the candidates on a sample (scoring is a Python loop), then decode in full.
    sample = data[:_SAMPLE_BYTES]
    ranked: list[tuple[float, int, str]] = []
    for order, candidate in enumerate(_HEURISTIC_CANDIDATES):
        text = _try_decode(sample, candidate, partial or len(data) > _SAMPLE_BYTES)
        if text is not None:
            ranked.append((-_plausibility(text), order, candidate))
    for _, _, candidate in sorted(ranked):
        text = _try_decode(data, candidate, partial)
        if text is not None:
            return text
    return data.decode("cp1252", errors="replace")


def _try_decode(data: bytes, codec: str, partial: bool) -> str | None:
    try:
        if partial:
            return codecs.getincrementaldecoder(codec)().decode(data, final=False)
        return data.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return None


def _plausibility(text: str) -> float:
    score = 0.0
    run = 0  # consecutive non-ASCII characters
    for char in text:
        code = ord(char)
        run = run + 1 if code >= 0x80 else 0
        if code < 0x80:
            if code < 0x20 and char not in "\t\r\n":
                score -= 3
        elif char in _COMMON_HAN:
            score += 3
        elif 0x4E00 <= code <= 0x9FFF:
            score += 0.5
        elif 0x3040 <= code <= 0x30FF:
            score += 2
        elif char in _COMMON_HANGUL:
            score += 3
        elif 0xAC00 <= code <= 0xD7A3:
            score += 0.25
        elif 0x3000 <= code <= 0x303F or 0xFF01 <= code <= 0xFF5E:
            score += 0.5
        elif 0xC0 <= code <= 0x17F and char.isalpha():
            # Accented letters come alone or in pairs in European words ("Größe"); long
            # runs of them are what CJK bytes look like through cp1252 ("ÄÚÈÝ" = "内容").
            score += 1 if run <= 2 else -1
        elif 0xE000 <= code <= 0xF8FF or unicodedata.category(char) in ("Cc", "Co", "Cn"):
            score -= 3
        else:
            score -= 1
    return score


def clean_text(text: str) -> str:
    """Replace lone surrogates (left by surrogateescape decoding) so the text encodes as UTF-8.

    >>> clean_text("a\\udce9b")
    'a?b'
    """
    if text.isascii():  # O(1) for str: no surrogates in it
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text
