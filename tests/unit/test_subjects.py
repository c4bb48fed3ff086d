"""Tests for subject validation, wildcard matching and the subscription index."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.engine.subjects import (
    EMPTY_MATCH,
    Match,
    SubjectIndex,
    filters_overlap,
    is_literal,
    is_subset,
    is_valid_filter,
    is_valid_subject,
    subject_matches,
)

# --------------------------------------------------------------------------------------
# Brute-force reference: a regex per filter, written independently of the trie.
# --------------------------------------------------------------------------------------


def _filter_regex(filter: str) -> re.Pattern[str]:
    parts = []
    for token in filter.split("."):
        if token == "*":
            parts.append(r"[^.]+")
        elif token == ">":
            parts.append(r".+")
        else:
            parts.append(re.escape(token))
    return re.compile(r"\.".join(parts))


def bf_matches(filter: str, subject: str) -> bool:
    return _filter_regex(filter).fullmatch(subject) is not None


# Literal tokens used to build filters; "c*" and ">d" check that wildcard characters
# inside a longer token are literal. The universe adds "z", which no filter names, so
# a `*` always has a token that no literal filter token covers.
FILTER_LITERALS = ["a", "b", "c*", ">d"]
UNIVERSE_TOKENS = [*FILTER_LITERALS, "z"]
MAX_FILTER_DEPTH = 3
# Witnesses for overlap, and counterexamples for subset, are never longer than the
# longer filter plus one token, so depth 4 covers every filter of depth <= 3.
UNIVERSE = [
    ".".join(tokens)
    for depth in range(1, MAX_FILTER_DEPTH + 2)
    for tokens in itertools.product(UNIVERSE_TOKENS, repeat=depth)
]


def _all_filters() -> list[str]:
    out = []
    for depth in range(1, MAX_FILTER_DEPTH + 1):
        for head in itertools.product([*FILTER_LITERALS, "*"], repeat=depth - 1):
            for last in [*FILTER_LITERALS, "*", ">"]:
                out.append(".".join([*head, last]))
    return out


ALL_FILTERS = _all_filters()
MATCH_SETS = {f: frozenset(s for s in UNIVERSE if bf_matches(f, s)) for f in ALL_FILTERS}

filters = st.sampled_from(ALL_FILTERS)
universe_subjects = st.sampled_from(UNIVERSE)


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "valid_subject", "valid_filter"),
    [
        ("foo", True, True),
        ("foo.bar", True, True),
        ("foo.bar.baz", True, True),
        ("*", False, True),
        (">", False, True),
        ("foo.*", False, True),
        ("foo.>", False, True),
        ("*.foo.*", False, True),
        ("*.>", False, True),
        ("foo.>.bar", False, False),  # `>` must be last
        (">.foo", False, False),
        (">.>", False, False),
        ("fo*", True, True),  # wildcard characters inside a token are literal
        ("fo>", True, True),
        ("*o", True, True),
        ("foo.b*r.>x", True, True),
        ("**", True, True),
        (">>", True, True),
        ("", False, False),  # empty subject / empty tokens
        (".", False, False),
        (".foo", False, False),
        ("foo.", False, False),
        ("foo..bar", False, False),
        ("foo.*.", False, False),
        ("foo bar", False, False),  # whitespace
        ("foo\tbar", False, False),
        ("foo\rbar", False, False),
        ("foo\nbar", False, False),
        ("foo. ", False, False),
        ("foo.* ", False, False),
        ("ünï.cødé.日本", True, True),  # unicode tokens are fine
        ("ünï.*", False, True),
        ("$JS.API.STREAM.INFO.x", True, True),
        ("_INBOX.abc123", True, True),
    ],
)
def test_validation(subject: str, valid_subject: bool, valid_filter: bool) -> None:
    assert is_valid_subject(subject) is valid_subject
    assert is_valid_filter(subject) is valid_filter


@pytest.mark.parametrize(
    ("subject", "literal"),
    [
        ("foo", True),
        ("foo.bar", True),
        ("fo*.b>r", True),
        ("*", False),
        (">", False),
        ("foo.*.bar", False),
        ("foo.>", False),
    ],
)
def test_is_literal(subject: str, literal: bool) -> None:
    assert is_literal(subject) is literal


@given(filters)
def test_valid_filters_are_literal_iff_valid_subjects(f: str) -> None:
    assert is_valid_filter(f)
    assert is_literal(f) is is_valid_subject(f)


# --------------------------------------------------------------------------------------
# Matching
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filter", "subject", "expected"),
    [
        ("foo", "foo", True),
        ("foo", "bar", False),
        ("foo", "foo.bar", False),
        ("foo.bar", "foo", False),
        ("*", "foo", True),
        ("*", "foo.bar", False),  # `*` is exactly one token
        ("foo.*", "foo.bar", True),
        ("foo.*", "foo", False),
        ("foo.*", "foo.bar.baz", False),
        ("*.bar", "foo.bar", True),
        ("*.*", "foo.bar", True),
        ("foo.*.baz", "foo.bar.baz", True),
        ("foo.*.baz", "foo.bar.qux", False),
        (">", "foo", True),
        (">", "foo.bar.baz", True),
        ("foo.>", "foo.bar", True),
        ("foo.>", "foo.bar.baz", True),
        ("foo.>", "foo", False),  # `>` needs at least one token
        ("foo.>", "foobar.baz", False),
        ("*.>", "foo", False),
        ("*.>", "foo.bar", True),
        ("fo*", "foo", False),  # literal `*` character
        ("fo*", "fo*", True),
        ("fo*.>", "fo*.x", True),
        ("f>", "f>", True),
        ("f>", "fx", False),
        ("ünï.*", "ünï.日本", True),
    ],
)
def test_subject_matches(filter: str, subject: str, expected: bool) -> None:
    assert subject_matches(filter, subject) is expected
    assert bf_matches(filter, subject) is expected  # keeps the reference honest

    index: SubjectIndex[str] = SubjectIndex()
    index.add(filter, "sub")
    assert (index.match(subject).plain == ("sub",)) is expected


@given(filters, universe_subjects)
def test_subject_matches_agrees_with_reference(f: str, subject: str) -> None:
    assert subject_matches(f, subject) is bf_matches(f, subject)


# --------------------------------------------------------------------------------------
# Overlap and subset, against the enumerated universe
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("foo", "foo", True),
        ("foo", "bar", False),
        ("foo.*", "foo.bar", True),
        ("foo.>", "foo", False),
        ("foo.>", "foo.*.baz", True),
        ("*.bar", "foo.*", True),
        ("*.bar", "foo.baz", False),
        (">", "a.b.c", True),
        ("*", "a.b", False),
        ("*.*", "*.>", True),
    ],
)
def test_filters_overlap_table(a: str, b: str, overlap: bool) -> None:
    assert filters_overlap(a, b) is overlap
    assert filters_overlap(b, a) is overlap


@pytest.mark.parametrize(
    ("narrow", "wide", "subset"),
    [
        ("foo.bar", "foo.*", True),
        ("foo.*", "foo.bar", False),
        ("foo.*", "foo.>", True),
        ("foo.>", "foo.*", False),
        ("foo.>", "foo.>", True),
        ("foo.>", ">", True),
        ("foo", "foo.>", False),
        (">", "*.>", False),
        ("*.>", ">", True),
        ("*", "*", True),
        ("fo*", "*", True),
        ("*", "fo*", False),
    ],
)
def test_is_subset_table(narrow: str, wide: str, subset: bool) -> None:
    assert is_subset(narrow, wide) is subset


def test_overlap_and_subset_exhaustive() -> None:
    for a, b in itertools.product(ALL_FILTERS, repeat=2):
        sa, sb = MATCH_SETS[a], MATCH_SETS[b]
        assert filters_overlap(a, b) is bool(sa & sb), (a, b)
        assert is_subset(a, b) is (sa <= sb), (a, b)


@given(filters, filters)
def test_filters_overlap_against_brute_force(a: str, b: str) -> None:
    witnesses = [s for s in UNIVERSE if bf_matches(a, s) and bf_matches(b, s)]
    assert filters_overlap(a, b) is bool(witnesses)


@given(filters, filters)
def test_is_subset_against_brute_force(narrow: str, wide: str) -> None:
    counterexamples = [s for s in UNIVERSE if bf_matches(narrow, s) and not bf_matches(wide, s)]
    assert is_subset(narrow, wide) is (not counterexamples)


# --------------------------------------------------------------------------------------
# SubjectIndex
# --------------------------------------------------------------------------------------


def _normalise(match: Match[int]) -> tuple[Counter[int], list[list[int]]]:
    return Counter(match.plain), sorted(sorted(g) for g in match.groups)


def _expected(
    entries: set[tuple[str, int, str | None]], subject: str
) -> tuple[Counter[int], list[list[int]]]:
    plain: Counter[int] = Counter()
    groups: dict[str, list[int]] = {}
    for f, item, queue in entries:
        if not bf_matches(f, subject):
            continue
        if queue is None:
            plain[item] += 1
        else:
            groups.setdefault(queue, []).append(item)
    return plain, sorted(sorted(g) for g in groups.values())


items = st.integers(0, 3)
queues = st.sampled_from([None, None, "q", "r"])
# Every operation is (kind, filter_or_subject, item_or_pick, queue).
Op = tuple[str, str, int, str | None]
ops: st.SearchStrategy[Op] = st.one_of(
    st.tuples(st.just("add"), filters, items, queues),
    st.tuples(st.just("remove"), filters, items, queues),
    # Usually removes target a live entry (picked by index) so removal paths get exercised.
    st.tuples(st.just("remove_existing"), st.just(""), st.integers(0, 1000), st.none()),
    # Removes the live entries selected by the bits of the number, plus an unknown one.
    st.tuples(st.just("remove_many"), filters, st.integers(0, 2**16), st.none()),
    st.tuples(st.just("match"), universe_subjects, st.just(0), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=60), st.sampled_from([0, 1, 3, 8192]))
def test_index_against_brute_force(operations: list[Op], cache_size: int) -> None:
    index: SubjectIndex[int] = SubjectIndex(cache_size=cache_size)
    entries: set[tuple[str, int, str | None]] = set()
    # Subjects queried so far: they sit in the cache, so re-checking all of them after
    # every mutation is what exposes a stale cache entry.
    seen: list[str] = []

    def check(subject: str) -> None:
        got = index.match(subject)
        assert _normalise(got) == _expected(entries, subject), subject
        if not got:
            assert got is EMPTY_MATCH
        # The per-prefix result (reply inboxes) is the very same match, in order too.
        assert index.match_family(subject) == got, subject

    for kind, text, number, queue in operations:
        if kind == "match":
            check(text)
            if text not in seen:
                seen.append(text)
            continue
        if kind == "remove_existing":
            if not entries:
                continue
            entry = sorted(entries, key=repr)[number % len(entries)]
            index.remove(*entry)
            entries.discard(entry)
        elif kind == "remove_many":
            live = sorted(entries, key=repr)
            chosen = [e for i, e in enumerate(live) if number >> (i % 17) & 1]
            index.remove_many([*chosen, (text, 99, None)])
            entries.difference_update(chosen)
        elif kind == "add":
            index.add(text, number, queue)
            entries.add((text, number, queue))
        else:
            index.remove(text, number, queue)
            entries.discard((text, number, queue))
        assert len(index) == len(entries)
        for subject in seen:
            check(subject)


def test_same_item_under_overlapping_filters_appears_per_entry() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("foo.*", "s1")
    index.add("foo.>", "s1")
    index.add("foo.bar", "s1")
    assert Counter(index.match("foo.bar").plain) == {"s1": 3}
    assert index.match("foo.bar.baz").plain == ("s1",)
    assert len(index) == 3


def test_add_is_idempotent_per_entry() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("foo", "s")
    index.add("foo", "s")
    index.add("foo", "s", "q")
    index.add("foo", "s", "q")
    assert len(index) == 2
    m = index.match("foo")
    assert m.plain == ("s",)
    assert m.groups == (("s",),)


def test_queue_groups_merge_across_filters() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("foo.*", "a", "q")
    index.add("foo.>", "b", "q")
    index.add("foo.bar", "c", "q")
    index.add("foo.*", "x", "other")
    index.add("foo.*", "p")
    m = index.match("foo.bar")
    assert m.plain == ("p",)
    assert sorted(sorted(g) for g in m.groups) == [["a", "b", "c"], ["x"]]
    # Only the `>` member of q matches a deeper subject.
    m = index.match("foo.bar.baz")
    assert m.plain == ()
    assert m.groups == (("b",),)


def test_removing_last_member_removes_group() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("foo", "a", "q")
    index.add("foo.*", "b", "q")
    index.add("foo", "c", "r")
    assert sorted(sorted(g) for g in index.match("foo").groups) == [["a"], ["c"]]
    index.remove("foo", "a", "q")
    assert index.match("foo").groups == (("c",),)
    index.remove("foo", "c", "r")
    assert index.match("foo") is EMPTY_MATCH
    assert index.match("foo.x").groups == (("b",),)
    index.remove("foo.*", "b", "q")
    assert index.match("foo.x") is EMPTY_MATCH
    assert len(index) == 0


def test_remove_unknown_is_noop() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("foo.bar", "a")
    index.remove("foo.bar", "b")
    index.remove("foo.bar", "a", "q")
    index.remove("foo.*", "a")
    index.remove("foo", "a")
    index.remove("foo.bar.baz", "a")
    index.remove("not valid..", "a")
    assert len(index) == 1
    assert index.match("foo.bar").plain == ("a",)


def test_remove_many_sweeps_cache_once_for_all_filters() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("a.*", "s1")
    index.add("a.>", "s1", "q")
    index.add("*.b", "s2")
    index.add("a.b", "s3")
    index.add("c.d", "s3")
    untouched = index.match("x.y")
    assert sorted(index.match("a.b").plain) == ["s1", "s2", "s3"]
    index.remove_many(
        [("a.*", "s1", None), ("a.>", "s1", "q"), ("a.b", "s3", None), ("a.*", "gone", None)]
    )
    assert len(index) == 2
    assert index.match("a.b").plain == ("s2",)
    assert index.match("a.b").groups == ()
    assert index.match("c.d").plain == ("s3",)
    assert index.match("x.y") is untouched
    index.remove_many(iter([("*.b", "s2", None)]))
    assert index.match("a.b") is EMPTY_MATCH


def test_remove_many_with_too_many_wildcards_stays_correct() -> None:
    index: SubjectIndex[int] = SubjectIndex()
    entries = [(f"w{i}.*", i, None) for i in range(300)]
    for f, item, _ in entries:
        index.add(f, item)
    index.add("keep.*", -1)
    for i in range(300):
        assert index.match(f"w{i}.x").plain == (i,)
    assert index.match("keep.x").plain == (-1,)
    index.remove_many(entries)
    for i in range(300):
        assert index.match(f"w{i}.x") is EMPTY_MATCH
    assert index.match("keep.x").plain == (-1,)
    assert len(index) == 1


def test_remove_prunes_and_readd_works() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("a.b.c.>", "s")
    index.remove("a.b.c.>", "s")
    assert len(index) == 0
    assert index.match("a.b.c.d") is EMPTY_MATCH
    index.add("a.b.c.>", "s")
    assert index.match("a.b.c.d").plain == ("s",)


def test_add_rejects_invalid() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    for bad in ["", "foo..bar", "foo.>.bar", "foo bar", ".foo"]:
        with pytest.raises(ValueError):
            index.add(bad, "s")
    with pytest.raises(ValueError):
        index.add("foo", "s", "")
    assert len(index) == 0


def test_match_results_are_shared_and_immutable() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    assert index.match("nobody.here") is EMPTY_MATCH
    assert not EMPTY_MATCH
    index.add("foo", "s")
    first = index.match("foo")
    assert first
    assert index.match("foo") is first
    with pytest.raises(FrozenInstanceError):
        first.plain = ()  # type: ignore[misc]


def test_cache_invalidation_is_selective() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("foo.*", "a")
    foo_bar = index.match("foo.bar")
    other = index.match("other.subject")
    deep = index.match("foo.bar.baz")
    index.add("foo.qux", "b")  # literal: only "foo.qux" is affected
    assert index.match("foo.bar") is foo_bar
    index.add("foo.*.baz", "c")  # wildcard: only what it matches is affected
    assert index.match("foo.bar") is foo_bar
    assert index.match("other.subject") is other
    assert index.match("foo.bar.baz") is not deep
    assert index.match("foo.bar.baz").plain == ("c",)
    index.add("*.bar", "d")
    assert index.match("foo.bar").plain == ("a", "d")
    assert index.match("other.subject") is other


def test_bounded_cache_evicts_and_stays_correct() -> None:
    index: SubjectIndex[int] = SubjectIndex(cache_size=16)
    index.add("s.*", 1)
    for i in range(200):
        assert index.match(f"s.{i}").plain == (1,)
    index.add("s.>", 2)
    for i in range(200):
        assert sorted(index.match(f"s.{i}").plain) == [1, 2]


def test_match_once_agrees_with_match_and_does_not_fill_the_cache() -> None:
    from tether.engine.subjects import SubjectIndex

    index: SubjectIndex[str] = SubjectIndex()
    index.add("_INBOX.abc.*", "inbox")
    index.add("_INBOX.>", "all")
    index.add("orders.new", "orders")
    once = index.match_once("_INBOX.abc.17")
    assert sorted(once.plain) == ["all", "inbox"]
    assert index.match_once("orders.new").plain == ("orders",)
    assert "_INBOX.abc.17" not in index._cache
    assert index.match("_INBOX.abc.17") == once


def test_match_family_is_shared_per_prefix_except_for_literal_children() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("_INBOX.abc.*", "inbox")
    index.add("_INBOX.abc.7", "seven")
    family = index.match_family("_INBOX.abc.1")
    assert family.plain == ("inbox",)
    assert index.match_family("_INBOX.abc.2") is family  # computed once for the prefix
    assert sorted(index.match_family("_INBOX.abc.7").plain) == ["inbox", "seven"]
    assert index.match_family("_INBOX.xyz.1") is EMPTY_MATCH
    assert index.match_family("_INBOX") is EMPTY_MATCH  # no prefix at all
    index.remove("_INBOX.abc.*", "inbox")  # any change forgets every prefix
    assert index.match_family("_INBOX.abc.1") is EMPTY_MATCH
    assert index.match_family("_INBOX.abc.7").plain == ("seven",)
    assert "_INBOX.abc.1" not in index._cache  # like match_once: the cache stays clean
