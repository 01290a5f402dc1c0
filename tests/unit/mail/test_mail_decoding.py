# ruff: noqa: RUF001  (full-width punctuation and dashes are the test data)
"""Charsets, RFC 2047 encoded words, RFC 2045/2231 parameters, address lists."""

from __future__ import annotations

import base64

import pytest

from connectors.core.mail.addresses import _strict_getaddresses, parse_addresses
from connectors.core.mail.charsets import clean_text, decode_text, normalize_charset
from connectors.core.mail.encodedwords import decode_words
from connectors.core.mail.params import param_value, parse_params

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "codec", "declared"),
    [
        ("关于报价单的通知", "gbk", "gbk"),
        ("朱镕基访谈", "gbk", "gb2312"),  # 镕 is GBK-only: gb2312 label widened to gb18030
        ("會議通知：下週二開會", "big5", "big5"),
        ("会議のお知らせ", "iso2022_jp", "ISO-2022-JP"),
        ("会議のお知らせ", "cp932", "shift_jis"),
        ("계약서 확인 부탁드립니다", "cp949", "ks_c_5601-1987"),
        ("Grüße aus Zürich", "utf-8", "utf-8"),
        ("Grüße aus Zürich", "utf-8", "iso-8859-1"),  # UTF-8 mislabelled as Latin-1
        ("Crème brûlée – 5 €", "cp1252", "iso-8859-1"),
        ("Crème brûlée", "cp1252", "us-ascii"),
    ],
)
def test_declared_charsets_with_the_usual_mislabels(text: str, codec: str, declared: str) -> None:
    assert decode_text(text.encode(codec), declared) == text


@pytest.mark.parametrize(
    ("text", "codec"),
    [
        ("关于下周的会议安排", "gbk"),
        ("内容", "gbk"),
        ("订单确认", "gb18030"),
        ("關於下週的會議安排", "big5"),
        ("会議のお知らせ", "cp932"),
        ("会議のお知らせ", "iso2022_jp"),
        ("안녕하세요 회의", "cp949"),
        ("Müller und Söhne", "cp1252"),
        ("Größe", "cp1252"),
        ("naïve façade", "cp1252"),
        ("Ærøskøbing", "cp1252"),
        ("déjà vu", "utf-8"),
    ],
)
def test_undeclared_8bit_text_is_guessed(text: str, codec: str) -> None:
    for declared in (None, "x-unknown-charset"):
        assert decode_text(text.encode(codec), declared) == text


def test_decoding_never_fails() -> None:
    garbage = bytes(range(256)) * 3
    assert isinstance(decode_text(garbage, None), str)
    assert isinstance(decode_text(garbage, "utf-8"), str)
    assert isinstance(decode_text(garbage, "big5"), str)


def test_partial_input_drops_the_cut_character_only() -> None:
    data = "价格表".encode()
    assert decode_text(data[:-1], "utf-8", partial=True) == "价格"


@pytest.mark.parametrize("name", ["punycode", "idna", "unicode_escape", "rot13", "base64", ""])
def test_codecs_that_are_not_charsets_are_never_used(name: str) -> None:
    assert normalize_charset(name) is None
    assert decode_text(b"\\u0041 caf\xe9", name) == "\\u0041 café"


def test_clean_text_removes_lone_surrogates() -> None:
    assert clean_text("a\udcffb").encode("utf-8") == b"a?b"


def _b(text: str, charset: str) -> str:
    return f"=?{charset}?B?{base64.b64encode(text.encode(charset)).decode()}?="


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (_b("关于报价单的通知", "gbk"), "关于报价单的通知"),
        (_b("會議通知", "big5"), "會議通知"),
        (_b("会議のお知らせ", "iso2022_jp"), "会議のお知らせ"),
        ("Re: =?utf-8?q?caf=C3=A9?= =?utf-8?q?_cr=C3=A8me?=", "Re: café crème"),
        ("=?utf-8?q?a?= b =?utf-8?q?c?=", "a b c"),
        ("=?utf-8?b?5Lit5paH?=", "中文"),
        ("=?utf-8?b?5Lit5paH?", "=?utf-8?b?5Lit5paH?"),  # not closed: literal
        ("=?utf-8*en?q?hello?=", "hello"),  # RFC 2231 language suffix
        ("=?utf-8?b?5Lit5g?= =?utf-8?b?loc?=", "中文"),  # padding missing, char split
        ("=?x-unknown?q?caf=C3=A9?=", "café"),
        ("plain ascii", "plain ascii"),
    ],
)
def test_encoded_words(header: str, expected: str) -> None:
    assert decode_words(header) == expected


def test_multibyte_character_split_across_words() -> None:
    data = "你好世界".encode()
    header = (
        f"=?utf-8?q?{''.join(f'={b:02X}' for b in data[:4])}?=\r\n =?utf-8?q?"
        + "".join(f"={b:02X}" for b in data[4:])
        + "?="
    )
    assert decode_words(header.replace("\r\n", "")) == "你好世界"


def test_raw_8bit_header_bytes_with_encoded_words() -> None:
    raw = "Größe ".encode("cp1252") + b"=?utf-8?q?caf=C3=A9?="
    assert decode_words(raw) == "Größe café"


def test_rfc2231_continuations_and_charset() -> None:
    _, params = parse_params(
        "attachment; filename*0*=UTF-8''%E5%B9%B4%E5%BA%A6; filename*1*=%E6%8A%A5%E5%91%8A;"
        ' filename*2=".pdf"'
    )
    assert param_value(params, "filename") == "年度报告.pdf"


def test_rfc2231_single_extended_value_and_language() -> None:
    _, params = parse_params("text/csv; name*=iso-8859-1'fr'r%E9sum%E9.csv")
    assert param_value(params, "name") == "résumé.csv"


def test_rfc2231_beats_the_plain_parameter_and_gaps_end_the_value() -> None:
    _, params = parse_params('a; filename="old.txt"; filename*0="new"; filename*2="-lost"')
    assert param_value(params, "filename") == "new"


def test_rfc2047_in_a_quoted_parameter() -> None:
    _, params = parse_params(f'application/pdf; name="{_b("报价单.pdf", "gbk")}"')
    assert param_value(params, "name") == "报价单.pdf"


def test_quoted_parameters_keep_semicolons() -> None:
    main, params = parse_params('Multipart/Mixed; boundary="a;b\\"c"; x=1')
    assert main == "multipart/mixed"
    assert params == [("boundary", 'a;b"c'), ("x", "1")]


def test_parameter_parsing_is_bounded() -> None:
    value = "text/plain" + "".join(f"; p{i}=v" for i in range(20_000))
    _, params = parse_params(value, max_params=100)
    assert len(params) == 100


def test_addresses_with_encoded_names() -> None:
    assert parse_addresses(
        ['"=?utf-8?q?Ren=C3=A9?= D" <r@example.org>, =?gbk?B?1cXOsA==?= <z@x.cn>']
    ) == [
        {"name": "René D", "address": "r@example.org"},
        {"name": "张伟", "address": "z@x.cn"},
    ]


@pytest.mark.parametrize(
    "value",
    [
        "alice@example.org <bob@example.com>",  # CVE-2023-27043
        "a@example.org (unbalanced",
        "x@[10.0.0.1]",
    ],
)
def test_strict_address_parsing_refuses_ambiguous_fields(value: str) -> None:
    assert parse_addresses([value]) == []
    assert all(not address for _, address in _strict_getaddresses([value]))


def test_group_syntax_and_empty_lists() -> None:
    assert parse_addresses(["Undisclosed recipients:;"]) == []
    assert parse_addresses(["team: a@example.org, b@example.org;"]) == [
        {"name": None, "address": "a@example.org"},
        {"name": None, "address": "b@example.org"},
    ]


def test_8bit_bytes_inside_an_rfc2231_value() -> None:
    # Found by fuzzing: the bytes parser hands 8-bit bytes over as surrogates.
    value = b"attachment; filename*0*=UTF-8''%E5%B9%B4\xe5%BA%A6.pdf".decode(
        "ascii", "surrogateescape"
    )
    filename = param_value(parse_params(value)[1], "filename")
    assert filename is not None and filename.endswith(".pdf")
    assert clean_text(filename) == filename
