"""Properties of the nats-server configuration parser: any nested document, written in
any mix of the format's styles, reads back as the same values; any text at all either
parses or raises the parser's own error, with a position inside the text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.server.conf import ConfError, parse_duration, parse_text, to_plain
from tether.server.conf.values import SIZE_FACTORS

CORPUS = Path(__file__).parent / "conf_corpus"
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
BOOL_WORDS = {True: ["true", "TRUE", "yes", "on", "On"], False: ["false", "No", "off", "OFF"]}
_LETTERS = "abcxyzABCXYZ_"
_BARE_KEY = st.builds(
    str.__add__, st.sampled_from(_LETTERS), st.text(_LETTERS + "0123456789", max_size=8)
).filter(lambda k: k.lower() != "include")
_WORD = st.builds(
    str.__add__, st.sampled_from(_LETTERS), st.text(_LETTERS + "0123456789./@+-", max_size=8)
)
_QUOTED_KEY = st.text(
    st.characters(blacklist_characters="\"'", blacklist_categories=("Cs",)), max_size=8
)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_SAFE_UNQUOTED = re.compile(r"[A-Za-z_][A-Za-z0-9_./@+-]*")


class Doc:
    """A value and the conf text that must read back as it. A block string's closing
    ``)`` must end its line, so what follows it starts with a new line."""

    def __init__(self, value: Any, text: str, *, block: bool = False) -> None:
        self.value = value
        self.text = text
        self.block = block


def _float_doc(sign: str, whole: int, frac: str) -> Doc:
    text = f"{sign}{whole}.{frac}"
    return Doc(float(text), text)


floats = st.builds(
    _float_doc,
    st.sampled_from(["", "-"]),
    st.integers(0, 10**6),
    st.integers(0, 999999).map(str),
)


@st.composite
def ints(draw: st.DrawFn) -> Doc:
    value = draw(INT64)
    forms = [str(value)]
    for suffix, factor in SIZE_FACTORS.items():
        if suffix and value and value % factor == 0:
            forms.append(f"{value // factor}{draw(st.sampled_from([suffix, suffix.upper()]))}")
    return Doc(value, draw(st.sampled_from(forms)))


@st.composite
def bools(draw: st.DrawFn) -> Doc:
    value = draw(st.booleans())
    return Doc(value, draw(st.sampled_from(BOOL_WORDS[value])))


def _double_quoted(s: str, hex_escapes: bool) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\t\n\r":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r"}[c])
        elif hex_escapes and not c.isalnum():
            out.append("".join(f"\\x{b:02x}" for b in c.encode()))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


@st.composite
def strings(draw: st.DrawFn) -> Doc:
    s = draw(_TEXT | _WORD | st.just(""))
    forms = [_double_quoted(s, False), _double_quoted(s, True)]
    if "'" not in s:
        forms.append(f"'{s}'")
    if _SAFE_UNQUOTED.fullmatch(s) and s.lower() not in {
        "true",
        "false",
        "yes",
        "no",
        "on",
        "off",
    }:
        forms.append(s)
    if s.endswith("\n") and "\n)" not in s and draw(st.integers(0, 4)) == 0:
        return Doc(s, f"({s})", block=True)
    return Doc(s, draw(st.sampled_from(forms)))


def _after(draw: st.DrawFn, item: Doc, options: list[str]) -> str:
    """What follows one entry: a separator, sometimes with a comment."""
    if item.block:
        return draw(st.sampled_from(["\n", "\n\n  "]))
    sep = draw(st.sampled_from(options))
    comment = draw(st.sampled_from(["", "", "  # a comment", " // another", "\t#"]))
    return sep.rstrip(" \n") + comment + "\n" if comment else sep


@st.composite
def arrays(draw: st.DrawFn, elements: st.SearchStrategy[Doc]) -> Doc:
    items = draw(st.lists(elements, max_size=4))
    parts = []
    for n, item in enumerate(items):
        last = n == len(items) - 1
        options = ["", " ", ",", "\n", ", "] if last else [",", ", ", "\n", " ,\n  ", "\n\n"]
        parts.append(item.text + _after(draw, item, options))
    opening = draw(st.sampled_from(["[", "[ ", "[\n  "]))
    return Doc([i.value for i in items], opening + "".join(parts) + "]")


def _entry(draw: st.DrawFn, key: str, item: Doc) -> str:
    if _SAFE_UNQUOTED.fullmatch(key) and draw(st.booleans()) and key.lower() != "include":
        written = key
        seps = [" = ", ": ", " ", "=", ":", "\t=\t", " :"]
    else:
        quote = draw(st.sampled_from(["'", '"']))
        written = f"{quote}{key}{quote}"
        seps = [" = ", ": ", " ", "=", ":"]
    return written + draw(st.sampled_from(seps)) + item.text


def _entries(draw: st.DrawFn, members: dict[str, Doc]) -> str:
    ends = ["\n", ";\n", ",\n", "; ", ", ", "\n\n  "]
    return "".join(_entry(draw, k, item) + _after(draw, item, ends) for k, item in members.items())


@st.composite
def maps(draw: st.DrawFn, values: st.SearchStrategy[Doc]) -> Doc:
    members = draw(st.dictionaries(_BARE_KEY | _QUOTED_KEY, values, max_size=4))
    body = _entries(draw, members)
    opening = draw(st.sampled_from(["{", "{ ", "{\n  "]))
    return Doc({k: v.value for k, v in members.items()}, opening + body + "}")


scalars = ints() | floats | bools() | strings()
values = st.recursive(scalars, lambda inner: arrays(inner) | maps(inner), max_leaves=12)


@st.composite
def documents(draw: st.DrawFn) -> Doc:
    members = draw(st.dictionaries(_BARE_KEY | _QUOTED_KEY, values, max_size=6))
    body = _entries(draw, members)
    if draw(st.booleans()):
        body = "# a generated file\n" + body
    if draw(st.booleans()):
        body = "{\n" + body + "}\n"
    return Doc({k: v.value for k, v in members.items()}, body)


@settings(max_examples=120, deadline=None)
@given(documents())
def test_any_document_in_any_style_reads_back(doc: Doc) -> None:
    assert to_plain(parse_text(doc.text, environ={})) == doc.value, doc.text


@settings(max_examples=50, deadline=None)
@given(values)
def test_a_variable_holds_the_value_it_names(doc: Doc) -> None:
    text = f"V: {doc.text}\nx: $V\nm {{ y: $V }}\n"
    assert to_plain(parse_text(text, environ={})) == {
        "V": doc.value,
        "x": doc.value,
        "m": {"y": doc.value},
    }


@settings(max_examples=50, deadline=None)
@given(values)
def test_an_environment_variable_is_read_as_a_value(doc: Doc) -> None:
    assert to_plain(parse_text("x: $V", environ={"V": doc.text})) == {"x": doc.value}


_SOUP_TOKENS = [
    *"{}[]()=:,;#'\"\\$.- \t\n\r\x00é01",
    *("//", "\\x", "\\xe2", "$A", "$B", "$C", "$NOPE", "key", "true", "1.5", "2m", "1MB"),
    *("include ", "include basic.conf", "include errors/include_cycle.conf"),
    *("10.0.0.1:4222", "2024-01-02T03:04:05Z", "2024-"),
]
_SOUP = st.lists(st.sampled_from(_SOUP_TOKENS), max_size=40).map("".join)


def _check_any_text(text: str) -> None:
    try:
        parsed = parse_text(text, base_dir=CORPUS, environ={"A": "1", "B": "$A", "C": "$C"})
    except ConfError as exc:
        assert exc.message
        if exc.pos is not None and exc.pos.file == "<config>":
            assert 1 <= exc.pos.line <= text.count("\n") + 1
            assert exc.pos.col >= 1
    else:
        assert isinstance(parsed, dict)


@settings(max_examples=500, deadline=None)
@given(_SOUP)
def test_token_soup_parses_or_raises_the_parsers_error(text: str) -> None:
    _check_any_text(text)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_parses_or_raises_the_parsers_error(text: str) -> None:
    _check_any_text(text)


_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@given(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(_UNITS))), min_size=1))
def test_go_durations_add_their_parts(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * _UNITS[unit] for n, unit in parts)
    assert abs(parse_duration(text) - expected) <= 1e-9 * max(1.0, expected)


@given(st.integers(0, 10**5), st.sampled_from(sorted(SIZE_FACTORS)), st.booleans())
def test_sizes_multiply_by_their_suffix(n: int, suffix: str, upper: bool) -> None:
    written = f"{n}{suffix.upper() if upper else suffix}"
    value = n * SIZE_FACTORS[suffix]
    if value < 2**63:
        assert to_plain(parse_text(f"x: {written}", environ={})) == {"x": value}
    else:
        with pytest.raises(ConfError, match="out of range"):
            parse_text(f"x: {written}", environ={})
