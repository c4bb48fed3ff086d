"""NATS subjects: validation, wildcard matching, and the subscription index.

A subject is a sequence of non-empty tokens separated by ``.``; a token contains no
whitespace (space, tab, CR, LF) but may contain any other character, unicode included.
In a *filter* (the subject of a subscription, a stream or a consumer) a token that is
exactly ``*`` matches exactly one token, and a token that is exactly ``>`` matches one
or more trailing tokens and must be the last token. ``*`` or ``>`` inside a longer
token (``fo*``) is an ordinary character. Published subjects must be literal.

:class:`SubjectIndex` answers "who is subscribed to this subject" for every published
message, so its :meth:`~SubjectIndex.match` is built for the hit path: results are
immutable :class:`Match` objects shared from a bounded cache, and a cache hit is one
dict lookup.
"""

from __future__ import annotations

import random
import re
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Generic, TypeVar

# ``filter`` is the conventional NATS name for a subscription subject and is used as
# a parameter name throughout, so keep the builtin reachable under another name.
_builtin_filter = filter

__all__ = [
    "EMPTY_MATCH",
    "Match",
    "SubjectIndex",
    "filters_overlap",
    "is_literal",
    "is_subset",
    "is_valid_filter",
    "is_valid_subject",
    "subject_matches",
]

T = TypeVar("T", bound=Hashable)

_STAR = "*"
_GT = ">"

# Above this many wildcard filters changed at once (remove_many), clearing the match
# cache is cheaper than compiling one pattern for all of them (~0.1 ms per filter).
_MAX_SWEEP_FILTERS = 256


def _well_formed(subject: str) -> bool:
    """Tokens are non-empty and whitespace-free (wildcards not considered)."""
    # Plain substring scans run in C and beat a regex or a split for the short
    # strings subjects are; this is on the publish path.
    return not (
        not subject
        or subject[0] == "."
        or subject[-1] == "."
        or ".." in subject
        or " " in subject
        or "\t" in subject
        or "\r" in subject
        or "\n" in subject
    )


def is_valid_subject(subject: str) -> bool:
    """Whether ``subject`` is a valid literal subject, i.e. one a message may be published to."""
    if not _well_formed(subject):
        return False
    if _STAR in subject or _GT in subject:
        tokens = subject.split(".")
        return _STAR not in tokens and _GT not in tokens
    return True


def is_valid_filter(subject: str) -> bool:
    """Whether ``subject`` is a valid filter: ``*`` tokens anywhere, ``>`` only as the last token."""
    if not _well_formed(subject):
        return False
    if _GT in subject:
        tokens = subject.split(".")
        last = len(tokens) - 1
        for i, token in enumerate(tokens):
            if token == _GT and i != last:
                return False
    return True


def is_literal(subject: str) -> bool:
    """Whether a valid filter has no wildcard token (so it matches only itself)."""
    if _STAR not in subject and _GT not in subject:
        return True
    tokens = subject.split(".")
    return _STAR not in tokens and _GT not in tokens


def subject_matches(filter: str, subject: str) -> bool:
    """Whether the literal ``subject`` matches ``filter``.

    Both are assumed valid; the result for malformed input is unspecified.
    """
    if _STAR not in filter and _GT not in filter:
        return filter == subject
    filter_tokens = filter.split(".")
    tokens = subject.split(".")
    n = len(tokens)
    for i, f in enumerate(filter_tokens):
        if f == _GT:
            return n > i
        if i >= n:
            return False
        if f != _STAR and f != tokens[i]:
            return False
    return len(filter_tokens) == n


def filters_overlap(a: str, b: str) -> bool:
    """Whether some literal subject matches both filters ``a`` and ``b``."""
    ta = a.split(".")
    tb = b.split(".")
    na = len(ta)
    nb = len(tb)
    for i in range(min(na, nb)):
        x = ta[i]
        y = tb[i]
        # ``>`` swallows whatever the other filter still needs, as long as it needs
        # at least one token, which it does since both have a token at ``i``.
        if x == _GT or y == _GT:
            return True
        if x != y and x != _STAR and y != _STAR:
            return False
    return na == nb


def is_subset(narrow: str, wide: str) -> bool:
    """Whether every literal subject matching ``narrow`` also matches ``wide``."""
    tn = narrow.split(".")
    tw = wide.split(".")
    nn = len(tn)
    for i, w in enumerate(tw):
        if w == _GT:
            # Everything in ``narrow`` from here on has at least one token.
            return nn > i
        if i >= nn:
            return False
        n = tn[i]
        if n == _GT:
            # ``narrow`` reaches arbitrarily deep subjects but ``wide`` has a fixed depth.
            return False
        if w != _STAR and w != n:
            # A literal ``wide`` token admits only itself; ``narrow``'s ``*`` admits more.
            return False
    return nn == len(tw)


@dataclass(frozen=True, slots=True)
class Match(Generic[T]):
    """The subscribers of one subject, as returned by :meth:`SubjectIndex.match`.

    Instances live in the index's match cache and are handed to every caller asking
    about the same subject, which is why they are immutable.

    ``plain`` holds every non-queue entry whose filter matches, once per entry (an
    item added under two matching filters appears twice). ``groups`` holds one tuple
    per queue group name with that group's matching entries; the server delivers to
    one member of each.
    """

    plain: tuple[T, ...]
    groups: tuple[tuple[T, ...], ...]

    def __bool__(self) -> bool:
        return bool(self.plain) or bool(self.groups)


EMPTY_MATCH: Match[Any] = Match((), ())
"""The result for a subject nobody is subscribed to; shared, never reallocated."""


class _Node(Generic[T]):
    """A trie node: the entries whose filter ends here, and the next-token children."""

    __slots__ = ("children", "gt", "plain", "queues", "star")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.star: _Node[T] | None = None
        # The ``>`` child is always a leaf: it only carries entries.
        self.gt: _Node[T] | None = None
        # dicts used as insertion-ordered sets, so results come out in subscription order.
        self.plain: dict[T, None] = {}
        self.queues: dict[str, dict[T, None]] = {}

    def is_empty(self) -> bool:
        return not (
            self.children
            or self.star is not None
            or self.gt is not None
            or self.plain
            or self.queues
        )


class _MatchCache(dict[str, "Match[T]"]):
    """Bounded subject → :class:`Match` cache that computes misses itself.

    Being a ``dict`` subclass with ``__missing__`` makes a hit a single C-level
    subscript with no Python frame in between.
    """

    __slots__ = ("_index", "_max")

    def __init__(self, index: SubjectIndex[T], max_size: int) -> None:
        super().__init__()
        self._index = index
        self._max = max_size

    def __missing__(self, subject: str) -> Match[T]:
        result = self._index._compute(subject)
        if self._max > 0:
            size = len(self)
            if size >= self._max:
                # Evict a quarter in one go rather than one key per miss, so a churning
                # cache pays for eviction rarely. The batch starts at a random point in
                # insertion order: evicting strictly oldest-first would make a working
                # set slightly larger than the cache miss on every access.
                batch = max(1, self._max // 4)
                start = random.randrange(size - batch + 1)
                for key in list(islice(self, start, start + batch)):
                    del self[key]
            self[subject] = result
        return result


class SubjectIndex(Generic[T]):
    """Maps filters to items (subscriptions) and finds the items for a literal subject.

    Entries are ``(filter, item, queue)`` triples and behave as a set: adding the same
    triple twice is a no-op. The same item may be added under several filters or
    queues; each such entry counts separately in :meth:`match` and :func:`len`.

    Not thread-safe; meant to be driven from one event loop.
    """

    __slots__ = ("_beneath", "_cache", "_count", "_families", "_root")

    def __init__(self, cache_size: int = 8192) -> None:
        """Create an empty index whose match cache holds at most ``cache_size`` subjects.

        ``cache_size <= 0`` disables caching (every :meth:`match` walks the trie).
        """
        self._root: _Node[T] = _Node()
        self._count = 0
        self._cache: _MatchCache[T] = _MatchCache(self, cache_size)
        # See match_family: prefix -> (the match of ``prefix.<token>``, the tokens
        # that are exceptions). Emptied on every change of the index.
        self._families: dict[str, tuple[Match[T], frozenset[str]]] = {}
        # See match_beneath: stem -> the match shared by every subject beneath it, or
        # None when entries beneath it tell those subjects apart. Emptied on every change.
        self._beneath: dict[str, Match[T] | None] = {}

    def __len__(self) -> int:
        """The number of entries."""
        return self._count

    def add(self, filter: str, item: T, queue: str | None = None) -> None:
        """Subscribe ``item`` to ``filter``, optionally as a member of queue group ``queue``.

        Raises :class:`ValueError` for an invalid filter or an empty queue name.
        """
        if not is_valid_filter(filter):
            raise ValueError(f"invalid subject filter: {filter!r}")
        if queue is not None and not queue:
            raise ValueError("queue group name must not be empty")
        node = self._root
        for token in filter.split("."):
            if token == _STAR:
                if node.star is None:
                    node.star = _Node()
                node = node.star
            elif token == _GT:
                if node.gt is None:
                    node.gt = _Node()
                node = node.gt
            else:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                node = child
        if queue is None:
            if item in node.plain:
                return
            node.plain[item] = None
        else:
            members = node.queues.get(queue)
            if members is None:
                members = node.queues[queue] = {}
            elif item in members:
                return
            members[item] = None
        self._count += 1
        self._invalidate((filter,))

    def remove(self, filter: str, item: T, queue: str | None = None) -> None:
        """Undo :meth:`add` with the same arguments; a no-op for an unknown entry."""
        if self._remove_entry(filter, item, queue):
            self._invalidate((filter,))

    def remove_many(self, entries: Iterable[tuple[str, T, str | None]]) -> None:
        """:meth:`remove` each ``(filter, item, queue)``, e.g. all of a closing connection's.

        Equivalent to removing them one by one, but the match cache is swept once for
        all wildcard filters instead of once per filter.
        """
        removed = [f for f, item, queue in entries if self._remove_entry(f, item, queue)]
        if removed:
            self._invalidate(removed)

    def _remove_entry(self, filter: str, item: T, queue: str | None) -> bool:
        """Take one entry out of the trie, pruning emptied nodes; False if it was absent."""
        if not is_valid_filter(filter):
            return False
        # Remember the path so emptied nodes can be pruned bottom-up.
        path: list[tuple[_Node[T], str]] = []
        node = self._root
        for token in filter.split("."):
            if token == _STAR:
                nxt = node.star
            elif token == _GT:
                nxt = node.gt
            else:
                nxt = node.children.get(token)
            if nxt is None:
                return False
            path.append((node, token))
            node = nxt
        if queue is None:
            if item not in node.plain:
                return False
            del node.plain[item]
        else:
            members = node.queues.get(queue)
            if members is None or item not in members:
                return False
            del members[item]
            if not members:
                del node.queues[queue]
        self._count -= 1
        for parent, token in reversed(path):
            if not node.is_empty():
                break
            if token == _STAR:
                parent.star = None
            elif token == _GT:
                parent.gt = None
            else:
                del parent.children[token]
            node = parent
        return True

    def match(self, subject: str) -> Match[T]:
        """The entries whose filter matches the literal ``subject``.

        The result is shared and immutable. ``subject`` is assumed to be a valid
        literal subject (see :func:`is_valid_subject`).
        """
        return self._cache[subject]

    def match_once(self, subject: str) -> Match[T]:
        """Like :meth:`match`, without caching: for subjects used once (reply inboxes,
        ack subjects), which would only evict the hot entries of the cache."""
        cached = self._cache.get(subject)
        return cached if cached is not None else self._compute(subject)

    def match_family(self, subject: str) -> Match[T]:
        """Like :meth:`match_once`, for subjects that differ only in their last token.

        Reply inboxes (``_INBOX.<id>.<n>``) are each used once, but their subscribers
        are almost always found the same way for every ``<n>``: through wildcards at
        the last token. The match of ``<prefix>.<token>`` is therefore computed once per
        prefix and reused for every token that is not a literal child at that depth
        (those are the exceptions, matched on their own). ``subject`` is assumed to be
        a valid literal subject.
        """
        prefix, dot, last = subject.rpartition(".")
        if not dot:
            return self.match_once(subject)
        match, exceptions = self.family(prefix)
        if last in exceptions:
            return self.match_once(subject)
        return match

    def family(self, prefix: str) -> tuple[Match[T], frozenset[str]]:
        """The match of every subject ``prefix.<token>`` but for the tokens returned,
        which need :meth:`match` (see :meth:`match_family`); cached until the index
        changes. ``prefix`` is assumed to be a valid literal subject."""
        family = self._families.get(prefix)
        if family is None:
            if len(self._families) >= 1024:
                self._families.clear()
            family = self._families[prefix] = self._compute_family(prefix)
        return family

    def _compute_family(self, prefix: str) -> tuple[Match[T], frozenset[str]]:
        """:meth:`_compute` of ``prefix.<token>`` for a token no literal child is named."""
        hits, level = self._walk(prefix)
        if not level:
            return self._collect(hits), frozenset()
        # The last token: everything but the literal children is independent of it.
        exceptions: set[str] = set()
        last: list[_Node[T]] = []
        for node in level:
            if node.gt is not None:
                hits.append(node.gt)
            exceptions.update(node.children)
            if node.star is not None:
                last.append(node.star)
        hits.extend(last)
        return self._collect(hits), frozenset(exceptions)

    def match_beneath(self, stem: str, subject: str) -> Match[T]:
        """:meth:`match_once` of ``subject``, which is ``stem`` followed by one or more tokens.

        Ack subjects (``$JS.ACK.<stream>.<consumer>.<numbers>``) are each used once, but
        usually nothing but ``>`` wildcards reaches beneath their stem (the server's own
        ``$JS.ACK.>``): then every subject beneath the stem has the same match, which is
        computed once per stem and shared until the index changes. While an entry with a
        literal or ``*`` token beneath the stem exists, each subject is matched on its own.
        ``subject`` is assumed to be a valid literal subject.
        """
        shared = self._beneath.get(stem)
        if shared is not None:
            return shared
        match = self.match_once(subject)
        if stem not in self._beneath:
            self._remember_beneath(stem, match)
        return match

    def shared_beneath(self, stem: str, subject: str) -> Match[T] | None:
        """The match every subject beneath ``stem`` shares (see :meth:`match_beneath`),
        computed from ``subject`` (a valid literal beneath it) if need be; None while
        subjects beneath ``stem`` may match differently."""
        if stem in self._beneath:
            return self._beneath[stem]
        return self._remember_beneath(stem, self.match_once(subject))

    def _remember_beneath(self, stem: str, match: Match[T]) -> Match[T] | None:
        if len(self._beneath) >= 64:
            self._beneath.clear()
        shared = match if self._only_gt_beneath(stem) else None
        self._beneath[stem] = shared
        return shared

    def _only_gt_beneath(self, stem: str) -> bool:
        """Whether no entry below ``stem`` depends on the tokens after it (only ``>``)."""
        _, level = self._walk(stem)
        return all(not node.children and node.star is None for node in level)

    def _invalidate(self, filters: Iterable[str]) -> None:
        """Drop cached results that an entry change under any of ``filters`` affects."""
        if self._families:
            self._families.clear()
        if self._beneath:
            self._beneath.clear()
        cache = self._cache
        if not cache:
            return
        wildcards: list[str] = []
        for f in filters:
            if is_literal(f):
                # A literal filter matches exactly one subject.
                cache.pop(f, None)
            elif f == _GT:
                cache.clear()
                return
            else:
                wildcards.append(f)
        if not wildcards:
            return
        if len(wildcards) > _MAX_SWEEP_FILTERS:
            # Compiling the combined pattern would cost more than refilling the cache.
            cache.clear()
            return
        if len(wildcards) == 1:
            pattern = _filter_pattern(wildcards[0])
        else:
            pattern = re.compile(
                "|".join(f"(?:{_filter_regex(f)})" for f in dict.fromkeys(wildcards)),
                re.DOTALL,
            )
        # One C-level pass of a compiled pattern over the bounded cache beats any
        # per-key Python loop (roughly 0.1-0.3 us per cached subject).
        for subject in list(_builtin_filter(pattern.fullmatch, cache)):
            del cache[subject]

    def _compute(self, subject: str) -> Match[T]:
        """Walk the trie for ``subject`` (the cache-miss path)."""
        # First gather the nodes whose entries match, then read their entries.
        hits, level = self._walk(subject)
        hits.extend(level)
        return self._collect(hits)

    def _walk(self, subject: str) -> tuple[list[_Node[T]], list[_Node[T]]]:
        """The ``>`` nodes matched on the way down ``subject``'s tokens, and the nodes
        its last token reaches (empty when the walk died out early)."""
        hits: list[_Node[T]] = []
        level = [self._root]
        for token in subject.split("."):
            nxt: list[_Node[T]] = []
            for node in level:
                # A ``>`` child matches here: the current token and any after it are
                # its one-or-more trailing tokens.
                if node.gt is not None:
                    hits.append(node.gt)
                child = node.children.get(token)
                if child is not None:
                    nxt.append(child)
                if node.star is not None:
                    nxt.append(node.star)
            level = nxt
            if not level:
                break
        return hits, level

    @staticmethod
    def _collect(hits: list[_Node[T]]) -> Match[T]:
        """The entries of the matching nodes ``hits``, in order."""
        if not hits:
            return EMPTY_MATCH
        plain: list[T] = []
        groups: dict[str, list[T]] = {}
        for node in hits:
            if node.plain:
                plain.extend(node.plain)
            if node.queues:
                for name, members in node.queues.items():
                    group = groups.get(name)
                    if group is None:
                        groups[name] = list(members)
                    else:
                        group.extend(members)
        if not plain and not groups:
            # Only interior nodes were reached (e.g. ``foo`` when just ``foo.bar`` exists).
            return EMPTY_MATCH
        return Match(tuple(plain), tuple(tuple(members) for members in groups.values()))


def _filter_regex(filter: str) -> str:
    """A regex that fully matches exactly the strings the trie matches for ``filter``.

    It mirrors the trie token for token even on malformed subjects (a ``*`` there also
    matches an empty token), so invalidation can never miss a cached entry.
    """
    parts = []
    for token in filter.split("."):
        if token == _STAR:
            parts.append("[^.]*")
        elif token == _GT:
            parts.append(".*")
        else:
            parts.append(re.escape(token))
    return r"\.".join(parts)


def _filter_pattern(filter: str) -> re.Pattern[str]:
    """:func:`_filter_regex` compiled (``re`` caches it, so re-subscribing is cheap)."""
    return re.compile(_filter_regex(filter), re.DOTALL)
