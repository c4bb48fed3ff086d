"""Subject transforms: what each destination function does, partition buckets, and the
errors nats-server gives for bad transforms (the conformance suite checks the same
cases against the real server)."""

from __future__ import annotations

import pytest

from tether.engine.subject_transform import (
    SubjectTransform,
    TransformError,
    fnv1a32,
    validate_mapping,
)


@pytest.mark.parametrize(
    ("src", "dest", "subject", "out"),
    [
        ("foo.*", "bar.$1", "foo.a", "bar.a"),
        ("foo.*.*", "bar.{{wildcard(2)}}.{{ Wildcard( 1 ) }}", "foo.a.b", "bar.b.a"),
        ("a.*.>", "b.$1.>", "a.x.y.z", "b.x.y.z"),
        ("", "x.>", "p.q", "x.p.q"),
        ("*", "{{split(1,-)}}", "-abc-def--ghij-", "abc.def.ghij"),
        ("*", "{{split(1,-)}}", "--ab", ".ab"),
        ("*", "{{SplitFromLeft(1,3)}}", "12345", "123.45"),
        ("*", "{{splitfromright(1,3)}}", "12345", "12.345"),
        ("*", "{{slicefromleft(1,3)}}", "1234567890", "123.456.789.0"),
        ("*", "{{slicefromright(1,3)}}", "1234567890", "1.234.567.890"),
        ("*", "{{splitfromleft(1,9)}}", "12345", "12345"),
        ("*", "{{slicefromleft(1,0)}}", "12345", "12345"),
        ("*", "{{left(1,2)}}.{{Right(1,2)}}", "abcdef", "ab.ef"),
        ("*", "p.{{partition(10,1)}}", "foo", "p.3"),
        ("*", "p.{{partition(10,1)}}", "baz", "p.0"),
        ("*", "p.{{partition(10,1)}}", "qux", "p.9"),
        ("*.*", "{{partition(10,1,2)}}", "foo.bar", "0"),
        ("*.*", "{{partition(10)}}", "foo.bar", "6"),
        ("test.subject", "{{partition(5)}}", "test.subject", "0"),
        ("*", "{{partition(0,1)}}", "foo", "0"),
        ("foo.*", "$x.$1", "foo.a", "$x.a"),
        (">", ">", "any.thing", "any.thing"),
    ],
)
def test_destinations(src: str, dest: str, subject: str, out: str) -> None:
    assert SubjectTransform(src, dest).apply(subject) == out


def test_subjects_that_do_not_match_are_left_alone() -> None:
    t = SubjectTransform("foo.*", "bar.$1")
    assert t.apply("foo.a.b") is None
    assert t.apply("baz.a") is None
    assert t.apply("foo.*") is None


def test_random_stays_in_range() -> None:
    t = SubjectTransform("foo", "r.{{random(3)}}")
    assert {t.apply("foo") for _ in range(200)} <= {"r.0", "r.1", "r.2"}


def test_fnv1a32_vectors() -> None:
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


@pytest.mark.parametrize(
    ("src", "dest", "error"),
    [
        ("foo.*", "bar.{{wildcard(2)}}", "wildcard index out of range in {{wildcard(2)}}: [2]"),
        ("foo", "{{wildcard(1)}}", "wildcard index out of range in {{wildcard(1)}}"),
        ("foo.*", "{{foo(1)}}", "unknown function in {{foo(1)}}"),
        ("foo.*", "a..b", "invalid transform"),
        ("foo.*", "a.>.b", "invalid transform in b"),
        ("foo.*", "a.b c", "invalid transform"),
        (
            "foo.*",
            "x.{{wildcard()}}",
            "not enough arguments passed to the function in {{wildcard()}}",
        ),
        (
            "foo.*",
            "x.{{wildcard(1,2)}}",
            "too many arguments passed to the function in {{wildcard(1,2)}}",
        ),
        (
            "foo.*",
            "x.{{wildcard(a)}}",
            "function argument is invalid or in the wrong format in {{wildcard(a)}}",
        ),
        ("foo.*", "x.{{split(1)}}", "not enough arguments passed to the function in {{split(1)}}"),
        (
            "foo.*",
            "x.{{split(1,a b)}}",
            "function argument is invalid or in the wrong format in {{split(1,a b)}}",
        ),
        (
            "foo.*",
            "x.{{splitfromleft(1)}}",
            "not enough arguments passed to the function in {{splitfromleft(1)}}",
        ),
        (
            "foo.*",
            "x.{{partition(x,1)}}",
            "function argument is invalid or in the wrong format in {{partition(x,1)}}",
        ),
    ],
)
def test_errors_are_nats_servers(src: str, dest: str, error: str) -> None:
    with pytest.raises(TransformError) as caught:
        validate_mapping(src, dest)
    assert str(caught.value) == f"invalid mapping destination: {error}"


@pytest.mark.parametrize(("src", "dest"), [("foo.>", "bar"), ("foo", "bar.>"), ("foo", "bar.*")])
def test_wildcard_shape_must_agree(src: str, dest: str) -> None:
    with pytest.raises(TransformError, match=r"^invalid subject$"):
        validate_mapping(src, dest)


def test_an_empty_destination_is_no_transform() -> None:
    validate_mapping("foo.*", "")
