"""``SubjectIndex.match_beneath``: one shared match for the subjects beneath a stem."""

from __future__ import annotations

import random

import pytest

from tether.engine.subjects import SubjectIndex

STEM = "$JS.ACK"


def test_shared_while_only_gt_reaches_beneath() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("$JS.ACK.>", "acks")
    index.add("$JS.>", "all-js")
    index.add("$JS.API.>", "api")
    first = index.match_beneath(STEM, "$JS.ACK.S.C.1.1.1.0.0")
    assert first.plain == ("all-js", "acks")
    assert index.match_beneath(STEM, "$JS.ACK.T.D.2.5.9.1.3") is first


def test_entries_beneath_the_stem_are_matched_per_subject() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    index.add("$JS.ACK.>", "acks")
    index.match_beneath(STEM, "$JS.ACK.S.C.1.1.1.0.0")
    index.add("$JS.ACK.S.*.>", "one-stream")  # a change: the shared match is dropped
    assert index.match_beneath(STEM, "$JS.ACK.S.C.1.1.1.0.0").plain == ("acks", "one-stream")
    assert index.match_beneath(STEM, "$JS.ACK.T.C.1.1.1.0.0").plain == ("acks",)
    index.remove("$JS.ACK.S.*.>", "one-stream")
    assert index.match_beneath(STEM, "$JS.ACK.S.C.1.1.1.0.0").plain == ("acks",)


def test_queue_groups_and_nothing_at_all() -> None:
    index: SubjectIndex[str] = SubjectIndex()
    assert not index.match_beneath(STEM, "$JS.ACK.S.C.1.1.1.0.0")
    index.add("$JS.ACK.>", "a", queue="q")
    index.add("$JS.ACK.>", "b", queue="q")
    assert index.match_beneath(STEM, "$JS.ACK.S.C.1.1.1.0.0").groups == (("a", "b"),)


@pytest.mark.parametrize("seed", range(30))
def test_same_as_matching_each_subject(seed: int) -> None:
    rnd = random.Random(seed)
    tokens = ["$JS", "ACK", "S", "C", "1", "*", ">"]
    index: SubjectIndex[int] = SubjectIndex()
    reference: SubjectIndex[int] = SubjectIndex(cache_size=0)
    entries: list[tuple[str, int]] = []
    for step in range(60):
        if entries and rnd.random() < 0.35:
            filter_, item = entries.pop(rnd.randrange(len(entries)))
            index.remove(filter_, item)
            reference.remove(filter_, item)
        else:
            parts = [rnd.choice(tokens[:-1]) for _ in range(rnd.randint(0, 5))]
            if rnd.random() < 0.4 or not parts:
                parts.append(">")
            filter_ = ".".join(parts)
            entries.append((filter_, step))
            index.add(filter_, step)
            reference.add(filter_, step)
        for _ in range(4):
            rest = ".".join(rnd.choice(["S", "C", "1", "2"]) for _ in range(rnd.randint(1, 7)))
            subject = f"{STEM}.{rest}"
            assert index.match_beneath(STEM, subject) == reference.match(subject), subject
