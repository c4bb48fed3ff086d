"""nats-server's configuration format: a corpus of real-looking files and their values,
each construct on its own, and errors that name file, line and column."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tether.server.conf import ConfError, Item, parse_duration, parse_file, parse_text, to_plain

CORPUS = Path(__file__).parent / "conf_corpus"
ENV = {"TETHER_CORPUS_NAME": "from-env", "TETHER_CORPUS_PAYLOAD": "2MB"}


def values(text: str, **env: str) -> Any:
    return to_plain(parse_text(text, environ=env))


def error(text: str, **env: str) -> ConfError:
    with pytest.raises(ConfError) as caught:
        parse_text(text, filename="t.conf", environ=env)
    return caught.value


def _json_ready(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(value)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.conf")), ids=lambda p: p.name)
def test_corpus_file_parses_to_its_expected_values(path: Path) -> None:
    parsed = json.loads(json.dumps(to_plain(parse_file(path, environ=ENV)), default=_json_ready))
    assert parsed == json.loads(path.with_suffix(".json").read_text())


def test_the_corpus_has_an_expectation_for_every_file() -> None:
    confs = {p.stem for p in CORPUS.glob("*.conf")}
    assert confs == {p.stem for p in CORPUS.glob("*.json")}
    assert len(confs) >= 10


# Each malformed file: where the error is (file, line, column) and what it says.
ERRORS = {
    "unclosed_map.conf": ("unclosed_map.conf", 1, 15, "this '{' is never closed"),
    "bad_escape.conf": ("bad_escape.conf", 1, 16, "invalid escape '\\q'"),
    "missing_variable.conf": (
        "missing_variable.conf",
        1,
        7,
        "variable reference for 'TETHER_CORPUS_UNDEFINED' can not be found",
    ),
    "unquoted_duration.conf": ("unquoted_duration.conf", 2, 19, "quote durations"),
    "newline_after_equals.conf": (
        "newline_after_equals.conf",
        1,
        7,
        "expected a value after 'port' =, found a new line",
    ),
    "leading_comma.conf": ("leading_comma.conf", 2, 12, "unexpected ',' in the array"),
    "include_missing.conf": ("include_missing.conf", 2, 1, "missing.conf: not a file"),
    "include_cycle.conf": ("b.conf", 2, 1, "include cycle: 'a.conf' includes itself"),
    "bad_date.conf": ("bad_date.conf", 1, 7, "full Zulu form"),
    "bad_hex.conf": ("bad_hex.conf", 1, 6, "two hexadecimal digits after '\\x', got 'ZZ'"),
    "unclosed_string.conf": ("unclosed_string.conf", 1, 14, "quoted string is never closed"),
    "stray_brace.conf": ("stray_brace.conf", 1, 12, "found '}'"),
    "bad_suffix.conf": ("bad_suffix.conf", 1, 15, "unknown size suffix 'kbb'"),
    "integer_range.conf": ("integer_range.conf", 1, 14, "out of range"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_malformed_corpus_file_names_file_line_and_column(name: str) -> None:
    file, line, col, words = ERRORS[name]
    with pytest.raises(ConfError) as caught:
        parse_file(CORPUS / "errors" / name, environ=ENV)
    exc = caught.value
    assert exc.pos is not None
    assert (Path(exc.pos.file).name, exc.pos.line, exc.pos.col) == (file, line, col)
    assert words in exc.message
    assert str(exc).startswith(f"{exc.pos.file}:{line}:{col}: ")
    assert "\n" not in str(exc)


def test_every_malformed_corpus_file_has_an_expectation() -> None:
    assert {p.name for p in (CORPUS / "errors").glob("*.conf")} == set(ERRORS)


# -- assignments, separators, comments -------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "port = 4222",
        "port: 4222",
        "port 4222",
        "port\t4222",
        "port=4222",
        "port:4222",
        "port\n4222",
    ],
)
def test_three_assignment_styles(text: str) -> None:
    assert values(text) == {"port": 4222}


def test_entries_end_at_newline_semicolon_or_comma() -> None:
    assert values("a: 1; b: 2, c: 3\nd: 4;\n") == {"a": 1, "b": 2, "c": 3, "d": 4}
    assert values("m { a: 1; b: 2, c: 3\n d: 4 }") == {"m": {"a": 1, "b": 2, "c": 3, "d": 4}}


def test_comments_of_both_kinds_everywhere() -> None:
    text = """# top
    // also top
    a: 1 # after a value
    b: 2 // after a value
    m {  # after an opening brace
      # inside a map
      c: 3  // inside a map
    }
    l [  // after an opening bracket
      1  # after an element
      // between elements
      2
    ]
    """
    assert values(text) == {"a": 1, "b": 2, "m": {"c": 3}, "l": [1, 2]}


def test_later_key_wins_and_keys_keep_their_case() -> None:
    assert values("Port: 1\nport: 2\nport: 3") == {"Port": 1, "port": 3}


def test_a_map_may_follow_its_key_directly() -> None:
    assert values("tls {\n  verify: true\n}") == {"tls": {"verify": True}}
    assert values("tls = { verify: true }") == {"tls": {"verify": True}}


def test_whole_file_wrapped_in_braces() -> None:
    assert values('{\n  "a": 1,\n  "b": {"c": [1, 2]}\n}\n') == {"a": 1, "b": {"c": [1, 2]}}


def test_quoted_keys() -> None:
    assert values('"a.b c": 1\n\'d:e\' = 2\nm { "x y": 3 }') == {
        "a.b c": 1,
        "d:e": 2,
        "m": {"x y": 3},
    }


# -- strings ---------------------------------------------------------------------------


def test_double_quoted_escapes() -> None:
    assert values(r's: "\t\n\r\"\\\x41\xe2\x82\xac"') == {"s": '\t\n\r"\\A€'}


def test_single_quoted_strings_are_raw() -> None:
    assert values(r"s: 'a\tb $X \"'") == {"s": r"a\tb $X \""}


def test_nothing_is_interpolated_inside_quotes() -> None:
    assert values("X: 1\ns: \"$X\"\nt: '$X'") == {"X": 1, "s": "$X", "t": "$X"}


def test_unquoted_strings() -> None:
    assert values("a: localhost:4222\nb: nats://u:p@h:4222\nc: x#y\nd: a\\tb") == {
        "a": "localhost:4222",
        "b": "nats://u:p@h:4222",
        "c": "x#y",
        "d": "a\tb",
    }


def test_unquoted_string_ends_at_separators() -> None:
    assert values("l: [a, b]\nm {k: v}\nn: x;") == {"l": ["a", "b"], "m": {"k": "v"}, "n": "x"}


def test_block_string_ends_at_a_parenthesis_alone_on_a_line() -> None:
    text = "b (\n  text with ) inside\n)\nnext: 1\n"
    assert values(text) == {"b": "\n  text with ) inside\n", "next": 1}


def test_addresses_are_strings() -> None:
    assert values("a: 127.0.0.1\nb: 0.0.0.0:4222\nc: 10.0.0.1:-1") == {
        "a": "127.0.0.1",
        "b": "0.0.0.0:4222",
        "c": "10.0.0.1:-1",
    }


# -- numbers, sizes, booleans, dates ---------------------------------------------------


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("1k", 1000),
        ("1K", 1000),
        ("1kb", 1024),
        ("1KB", 1024),
        ("1ki", 1024),
        ("1KiB", 1024),
        ("64KB", 65536),
        ("1MB", 1024 * 1024),
        ("1M", 1_000_000),
        ("2m", 2_000_000),  # nats-server's pitfall: an unquoted 2m is a size, not minutes
        ("10G", 10_000_000_000),
        ("1GB", 2**30),
        ("1TB", 2**40),
        ("1P", 10**15),
        ("1PiB", 2**50),
        ("1E", 10**18),
        ("1EB", 2**60),
        ("-5k", -5000),
    ],
)
def test_sizes(written: str, value: int) -> None:
    assert values(f"x: {written}") == {"x": value}


def test_numbers() -> None:
    assert values("a: 0\nb: -12\nc: 1.5\nd: -0.25\ne: 9223372036854775807") == {
        "a": 0,
        "b": -12,
        "c": 1.5,
        "d": -0.25,
        "e": 2**63 - 1,
    }


def test_text_after_digits_is_a_string() -> None:
    assert values("a: 500ms\nb: 1h30m\nc: 10s\nd: 4222abc") == {
        "a": "500ms",
        "b": "1h30m",
        "c": "10s",
        "d": "4222abc",
    }


@pytest.mark.parametrize("word", ["true", "TRUE", "yes", "on", "On"])
def test_true_words(word: str) -> None:
    assert values(f"x: {word}") == {"x": True}


@pytest.mark.parametrize("word", ["false", "False", "no", "off", "OFF"])
def test_false_words(word: str) -> None:
    assert values(f"x: {word}") == {"x": False}


def test_quoted_bool_word_is_a_string() -> None:
    assert values('x: "true"') == {"x": "true"}


def test_zulu_datetime() -> None:
    assert values("t: 2006-01-02T15:04:05Z") == {"t": datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)}


# -- arrays and maps -------------------------------------------------------------------


def test_arrays_by_comma_or_newline_mixed_types_trailing_comma() -> None:
    text = "a: [1, 'two', {three: 3}, [4], true, ]\nb: [\n  x\n  y,\n  z\n]\nc: []"
    assert values(text) == {
        "a": [1, "two", {"three": 3}, [4], True],
        "b": ["x", "y", "z"],
        "c": [],
    }


def test_array_of_maps() -> None:
    text = "users = [\n  {user: a, password: b}\n  {user: c, password: d}\n]"
    assert values(text) == {
        "users": [{"user": "a", "password": "b"}, {"user": "c", "password": "d"}]
    }


# -- variables -------------------------------------------------------------------------


def test_variable_from_the_file() -> None:
    assert values("P: 4222\nport: $P") == {"P": 4222, "port": 4222}


def test_variable_from_an_enclosing_map_innermost_first() -> None:
    text = "V: outer\nm { V: inner, a: $V, n { b: $V } }\nc: $V"
    assert values(text) == {
        "V": "outer",
        "m": {"V": "inner", "a": "inner", "n": {"b": "inner"}},
        "c": "outer",
    }


def test_variable_defined_later_is_not_seen() -> None:
    assert "variable reference for 'P'" in error("port: $P\nP: 1").message


def test_file_variable_wins_over_the_environment() -> None:
    assert values("P: 1\nport: $P", P="2") == {"P": 1, "port": 1}


def test_environment_value_is_read_as_a_config_value() -> None:
    parsed = values(
        "a: $NUM\nb: $SIZE\nc: $FLAG\nd: $TEXT\ne: $LIST\nf: $EMPTY",
        NUM="4222",
        SIZE="64KB",
        FLAG="true",
        TEXT="hello",
        LIST="[1, 2]",
        EMPTY="",
    )
    assert parsed == {"a": 4222, "b": 65536, "c": True, "d": "hello", "e": [1, 2], "f": ""}


def test_environment_variable_naming_another() -> None:
    assert values("a: $A", A="$B", B="7") == {"a": 7}


def test_environment_reference_cycle_is_an_error() -> None:
    exc = error("a: $A", A="$B", B="$A")
    assert "cycle" in exc.message
    assert exc.pos is not None and (exc.pos.line, exc.pos.col) == (1, 4)


def test_environment_value_that_is_not_a_value() -> None:
    exc = error("a: $BAD", BAD="x y")
    assert "environment variable 'BAD' is not a value" in exc.message


def test_unquoted_bcrypt_hash_is_kept_literally() -> None:
    assert values("p: $2a$11$abc/def") == {"p": "$2a$11$abc/def"}


def test_variables_remember_they_were_used() -> None:
    doc = parse_text("A: 1\nB: 2\nx: $A", environ={})
    assert doc["A"].used
    assert not doc["B"].used


# -- includes --------------------------------------------------------------------------


def test_include_relative_to_the_including_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "main.conf").write_text(
        "a: 1\ninclude sub/one.conf\nm { include 'sub/two.conf' }\n"
    )
    (tmp_path / "sub" / "one.conf").write_text('b: 2\ninclude "three.conf"\n')
    (tmp_path / "sub" / "two.conf").write_text("c: 3\n")
    (tmp_path / "sub" / "three.conf").write_text("d: 4\n")
    doc = parse_file(tmp_path / "main.conf", environ={})
    assert to_plain(doc) == {"a": 1, "b": 2, "d": 4, "m": {"c": 3}}
    assert doc["d"].pos.file == str(tmp_path / "sub" / "three.conf")
    assert doc["d"].pos.line == 1


def test_include_keyword_any_case_and_later_keys_win(tmp_path: Path) -> None:
    (tmp_path / "x.conf").write_text("a: included\nb: included\n")
    (tmp_path / "main.conf").write_text("a: main\nINCLUDE x.conf\nb: main\n")
    assert to_plain(parse_file(tmp_path / "main.conf", environ={})) == {
        "a": "included",
        "b": "main",
    }


def test_included_file_cannot_see_the_includers_variables(tmp_path: Path) -> None:
    (tmp_path / "x.conf").write_text("b: $A\n")
    (tmp_path / "main.conf").write_text("A: 1\ninclude x.conf\n")
    with pytest.raises(ConfError) as caught:
        parse_file(tmp_path / "main.conf", environ={})
    assert caught.value.pos is not None
    assert caught.value.pos.file.endswith("x.conf")
    assert "included from" in caught.value.message


def test_includer_sees_the_included_keys_as_variables(tmp_path: Path) -> None:
    (tmp_path / "vars.conf").write_text("TOKEN: secret\n")
    (tmp_path / "main.conf").write_text("include vars.conf\nauthorization { token: $TOKEN }\n")
    assert to_plain(parse_file(tmp_path / "main.conf", environ={}))["authorization"] == {
        "token": "secret"
    }


def test_a_key_named_include_with_a_separator_is_a_key() -> None:
    assert values("include: 1") == {"include": 1}


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "col", "words"),
    [
        ("a: [1, 2", 1, 4, "'[' is never closed"),
        ("a {\n b: 1\n", 1, 3, "'{' is never closed"),
        ('a: "x', 1, 4, "never closed"),
        ("a: 'x", 1, 4, "never closed"),
        ("a: 1 2", 1, 6, "after the value, found '2'"),
        ("a: [1 2]", 1, 7, "expected ',' or ']'"),
        ("\n\n  = 1", 3, 3, "expected a key, found '='"),
        ("a: .5", 1, 4, "must start with a digit"),
        ("a: -x", 1, 5, "expected a digit after '-'"),
        ("a: 1.x", 1, 6, "expected a digit after '.'"),
        ("a: (\nno end", 1, 4, "')' alone on a line"),
        ("a", 1, 1, "'a' has no value"),
        ('a: "\\xff"', 1, 5, "do not spell UTF-8"),
        ("a: ,", 1, 4, "expected a value, found ','"),
        ("a: 1\n}", 2, 1, "expected a key, found '}'"),
        ("x: " + "[" * 100, 1, 68, "nested more than"),
    ],
)
def test_error_positions(text: str, line: int, col: int, words: str) -> None:
    exc = error(text)
    assert exc.pos is not None
    assert (exc.pos.file, exc.pos.line, exc.pos.col) == ("t.conf", line, col), exc
    assert words in exc.message


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(ConfError) as caught:
        parse_file(path)
    assert str(caught.value) == f"{path}:2:4: not UTF-8 text"


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfError, match="not a file"):
        parse_file(tmp_path / "nope.conf")


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "bom.conf"
    path.write_bytes(b"\xef\xbb\xbfport: 1\n")
    assert to_plain(parse_file(path)) == {"port": 1}


def test_map_entries_remember_where_their_key_is() -> None:
    doc = parse_text("a: 1\n  nested {\n    key: value\n  }\n", filename="f.conf", environ={})
    nested = doc["nested"]
    assert (nested.pos.line, nested.pos.col) == (2, 3)
    assert isinstance(nested.value, dict)
    inner: Item = nested.value["key"]
    assert str(inner.pos) == "f.conf:3:5"


# -- durations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("2m", 120.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("10us", 1e-5),
        ("10µs", 1e-5),
        ("3ns", 3e-9),
        ("-1s", -1.0),
        ("+2h", 7200.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "1d", "s", "1.5.5s", "2 m", "-"])
def test_not_go_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
