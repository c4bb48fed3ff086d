"""Subject transforms: ``{src, dest}`` rewrites of a message's subject, as nats-server
applies them to a stream's input (``subject_transform``) and to what a stream sources.

A destination is made of tokens that are either literal, a wildcard reference
(``$n`` or ``{{wildcard(n)}}``, ``n`` the 1-based position of a ``*`` in ``src``) or a
function of one source token: ``{{partition(n,i…)}}``, ``{{split(i,delim)}}``,
``{{splitfromleft(i,pos)}}``, ``{{splitfromright(i,pos)}}``,
``{{slicefromleft(i,size)}}``, ``{{slicefromright(i,size)}}``, ``{{random(n)}}``.

Parsing, validation and every error text follow nats-server's ``subject_transform.go``
and ``ValidateMapping``, so a bad transform is refused with the same words; partition
numbers are FNV-1a 32 of the chosen tokens, the same buckets nats-server computes, which
clients that route by partition rely on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = ["SubjectTransform", "TransformError", "fnv1a32", "validate_mapping"]

# Go's ``\s`` in RE2 is exactly these five (Python's would also take unicode spaces).
_WS = "[ \\t\\n\\f\\r]"
_COMMA = re.compile(f",{_WS}*")


def _function(name: str) -> re.Pattern[str]:
    # Each word may start in either case (``splitFromLeft``), as nats-server's patterns.
    words = re.findall("[A-Z]?[a-z]+", name)
    spelled = "".join(f"[{w[0].lower()}{w[0].upper()}]{w[1:].lower()}" for w in words)
    return re.compile(f"{{{{{_WS}*{spelled}{_WS}*\\((.*)\\){_WS}*}}}}")


_WILDCARD = _function("Wildcard")
_PARTITION = _function("Partition")
_SPLIT_FROM_LEFT = _function("SplitFromLeft")
_SPLIT_FROM_RIGHT = _function("SplitFromRight")
_SLICE_FROM_LEFT = _function("SliceFromLeft")
_SLICE_FROM_RIGHT = _function("SliceFromRight")
_SPLIT = _function("Split")
_LEFT = _function("Left")
_RIGHT = _function("Right")
_RANDOM = _function("Random")

# The functions ``ValidateMapping`` accepts in stream, source and mirror transforms
# (nats-server 2.15 takes ``left`` and ``right`` there too).
_VALIDATED = (
    _PARTITION,
    _WILDCARD,
    _SPLIT_FROM_LEFT,
    _SPLIT_FROM_RIGHT,
    _SLICE_FROM_LEFT,
    _SLICE_FROM_RIGHT,
    _SPLIT,
    _LEFT,
    _RIGHT,
    _RANDOM,
)

_INT = re.compile(r"[+-]?[0-9]+")
_INT64 = 2**63
_INT32 = 2**31

# What a destination token does.
_LITERAL = 0
_WILDCARD_REF = 1
_PARTITION_FN = 2
_SPLIT_FROM_LEFT_FN = 3
_SPLIT_FROM_RIGHT_FN = 4
_SLICE_FROM_LEFT_FN = 5
_SLICE_FROM_RIGHT_FN = 6
_SPLIT_FN = 7
_LEFT_FN = 8
_RIGHT_FN = 9
_RANDOM_FN = 10

_PREFIX = "invalid mapping destination"
INVALID_TRANSFORM = f"{_PREFIX}: invalid transform"
UNKNOWN_FUNCTION = f"{_PREFIX}: unknown function"
INDEX_OUT_OF_RANGE = f"{_PREFIX}: wildcard index out of range"
NOT_ENOUGH_ARGS = f"{_PREFIX}: not enough arguments passed to the function"
INVALID_ARG = f"{_PREFIX}: function argument is invalid or in the wrong format"
TOO_MANY_ARGS = f"{_PREFIX}: too many arguments passed to the function"
BAD_SUBJECT = "invalid subject"


class TransformError(ValueError):
    """A transform nats-server would refuse; the message is nats-server's text."""


def _in(err: str, token: str) -> TransformError:
    return TransformError(f"{err} in {token}" if token else err)


def _atoi(text: str, bits: int = 64) -> int | None:
    """Go's ``strconv.Atoi`` (or ``ParseInt(…, 10, bits)``): None when it fails."""
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    limit = _INT64 if bits == 64 else _INT32
    if not -limit <= value < limit:
        return None
    return value


def fnv1a32(data: bytes) -> int:
    """FNV-1a, 32 bits: the hash nats-server's ``partition`` buckets by."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@dataclass(frozen=True, slots=True)
class _Token:
    kind: int
    literal: str = ""
    indexes: tuple[int, ...] = ()  # wildcard positions as given (1-based)
    number: int = -1
    delimiter: str = ""


def _args(pattern: re.Pattern[str], token: str) -> list[str] | None:
    found = pattern.search(token)
    if found is None:
        return None
    return _COMMA.split(found.group(1))


def _index_and_int(token: str, args: list[str], kind: int) -> _Token:
    if len(args) < 2:
        raise _in(NOT_ENOUGH_ARGS, token)
    if len(args) > 2:
        raise _in(TOO_MANY_ARGS, token)
    index = _atoi(args[0].strip(" "))
    number = _atoi(args[1].strip(" "), 32)
    if index is None or number is None:
        raise _in(INVALID_ARG, token)
    return _Token(kind, indexes=(index,), number=number)


def _parse_token(token: str) -> _Token:
    """One destination token, as nats-server's ``indexPlaceHolders`` reads it."""
    length = len(token)
    if length <= 1:
        return _Token(_LITERAL, token)
    if token[0] == "$":
        # ``$1``; anything else starting with ``$`` is an ordinary token.
        index = _atoi(token[1:])
        if index is None:
            return _Token(_LITERAL, token)
        return _Token(_WILDCARD_REF, indexes=(index,))
    if not (length > 4 and token.startswith("{{") and token.endswith("}}")):
        return _Token(_LITERAL, token)
    args = _args(_WILDCARD, token)
    if args is not None:
        if len(args) == 1 and args[0] == "":
            raise _in(NOT_ENOUGH_ARGS, token)
        if len(args) > 1:
            raise _in(TOO_MANY_ARGS, token)
        index = _atoi(args[0].strip(" "))
        if index is None:
            raise _in(INVALID_ARG, token)
        return _Token(_WILDCARD_REF, indexes=(index,))
    args = _args(_PARTITION, token)
    if args is not None:
        count = _atoi(args[0].strip(" "))
        if count is None or count >= _INT32:
            raise _in(INVALID_ARG, token)
        indexes: list[int] = []
        for arg in args[1:]:
            index = _atoi(arg.strip(" "))
            if index is None:
                raise _in(INVALID_ARG, token)
            indexes.append(index)
        return _Token(_PARTITION_FN, indexes=tuple(indexes), number=count)
    for pattern, kind in (
        (_SPLIT_FROM_LEFT, _SPLIT_FROM_LEFT_FN),
        (_SPLIT_FROM_RIGHT, _SPLIT_FROM_RIGHT_FN),
        (_SLICE_FROM_LEFT, _SLICE_FROM_LEFT_FN),
        (_SLICE_FROM_RIGHT, _SLICE_FROM_RIGHT_FN),
        (_RIGHT, _RIGHT_FN),
        (_LEFT, _LEFT_FN),
    ):
        args = _args(pattern, token)
        if args is not None:
            return _index_and_int(token, args, kind)
    args = _args(_SPLIT, token)
    if args is not None:
        if len(args) < 2:
            raise _in(NOT_ENOUGH_ARGS, token)
        if len(args) > 2:
            raise _in(TOO_MANY_ARGS, token)
        index = _atoi(args[0].strip(" "))
        if index is None or " " in args[1] or "." in args[1]:
            raise _in(INVALID_ARG, token)
        return _Token(_SPLIT_FN, indexes=(index,), delimiter=args[1])
    args = _args(_RANDOM, token)
    if args is not None:
        if len(args) != 1:
            raise _in(NOT_ENOUGH_ARGS, token)
        count = _atoi(args[0].strip(" "))
        if count is None or count >= _INT32:
            raise _in(INVALID_ARG, token)
        return _Token(_RANDOM_FN, number=count)
    raise _in(UNKNOWN_FUNCTION, token)


def _subject_info(subject: str) -> tuple[bool, list[str], int, bool]:
    """valid, tokens, number of ``*``, has ``>`` (nats-server's ``subjectInfo``)."""
    if not subject:
        return False, [], 0, False
    tokens = subject.split(".")
    stars = 0
    full = False
    for token in tokens:
        if not token or full:
            return False, [], 0, False
        if token == ">":
            full = True
        elif token == "*":
            stars += 1
    return True, tokens, stars, full


class SubjectTransform:
    """A parsed ``{src, dest}``; :meth:`apply` maps a subject or says it does not match."""

    __slots__ = ("_plan", "_src_tokens", "_wild_positions", "dest", "src")

    def __init__(self, src: str, dest: str) -> None:
        """Parse as nats-server's ``NewSubjectTransform``; raises :class:`TransformError`.

        An empty ``src`` means ``>``. (An empty ``dest`` is "no transform": callers
        check for it, as nats-server does, before building one.)
        """
        src = src or ">"
        ok_src, src_tokens, stars, src_full = _subject_info(src)
        ok_dest, dest_tokens, dest_stars, dest_full = _subject_info(dest)
        if not ok_src or not ok_dest or dest_stars > 0 or src_full != dest_full:
            raise TransformError(BAD_SUBJECT)
        # 1-based wildcard number -> the position of that ``*`` among src's tokens.
        positions: dict[int, int] = {}
        for i, token in enumerate(src_tokens):
            if token == "*":
                positions[len(positions) + 1] = i
        plan: list[tuple[_Token, tuple[int, ...]]] = []
        for token in dest_tokens:
            parsed = _parse_token(token)
            if parsed.kind in (_LITERAL, _RANDOM_FN):
                plan.append((parsed, ()))
            elif stars or src_full:
                refs: list[int] = []
                for index in parsed.indexes:
                    if index > stars:
                        raise _in(INDEX_OUT_OF_RANGE, f"{token}: [{index}]")
                    # Go reads a missing entry of its map as 0: index 0 or below
                    # refers to the first token.
                    refs.append(positions.get(index, 0))
                plan.append((parsed, tuple(refs)))
            elif parsed.kind == _PARTITION_FN:
                # Without wildcards in src, a partition hashes the whole subject.
                plan.append((parsed, ()))
            else:
                raise _in(INDEX_OUT_OF_RANGE, token)
        self.src = src
        self.dest = dest
        self._src_tokens = src_tokens
        self._wild_positions = positions
        self._plan = plan

    def apply(self, subject: str) -> str | None:
        """The transformed subject, or None when ``subject`` does not match ``src``."""
        if self.src == ">" and self.dest == ">":
            return subject
        tokens = subject.split(".")
        if any(not t or t in ("*", ">") for t in tokens):
            return None
        if self.src != ">" and not _tokens_match(self._src_tokens, tokens):
            return None
        return self.transform_tokens(tokens)

    def transform_tokens(self, tokens: list[str]) -> str:
        """Map a subject known to match (its tokens), nats-server's way."""
        out: list[str] = []
        last = len(self._plan) - 1
        for i, (token, refs) in enumerate(self._plan):
            kind = token.kind
            if kind == _LITERAL:
                if token.literal == ">":
                    break
                out.append(token.literal)
            elif kind == _WILDCARD_REF:
                if refs and refs[0] < len(tokens):
                    out.append(tokens[refs[0]])
            elif kind == _PARTITION_FN:
                key = "".join(tokens[r] for r in refs) if refs else ".".join(tokens)
                out.append(_partition(key.encode(), token.number))
            elif kind == _RANDOM_FN:
                n = token.number
                out.append(str(random.randrange(_INT32) % n) if n else "0")
            else:
                out.append(_apply_function(token, tokens[refs[0]]))
            if i < last:
                out.append(".")
        if self._plan and self._plan[-1][0].literal == ">" and self._plan[-1][0].kind == _LITERAL:
            out.append(".".join(tokens[len(self._src_tokens) - 1 :]))
        return "".join(out)


def _partition(key: bytes, buckets: int) -> str:
    if buckets == 0:
        return "0"
    # Go takes the count as uint32: a negative one wraps.
    return str(fnv1a32(key) % (buckets & 0xFFFFFFFF))


def _apply_function(token: _Token, source: str) -> str:
    kind = token.kind
    n = token.number
    size = len(source)
    if kind == _SPLIT_FN:
        return _split(source, token.delimiter)
    if not 0 < n < size:
        return source  # too short to cut where asked: unchanged
    if kind == _SPLIT_FROM_LEFT_FN:
        return f"{source[:n]}.{source[n:]}"
    if kind == _SPLIT_FROM_RIGHT_FN:
        return f"{source[: size - n]}.{source[size - n :]}"
    if kind == _SLICE_FROM_LEFT_FN:
        return ".".join(source[i : i + n] for i in range(0, size, n))
    if kind == _SLICE_FROM_RIGHT_FN:
        head = size % n
        parts = [source[:head]] if head else []
        parts += [source[i : i + n] for i in range(head, size, n)]
        return ".".join(parts)
    if kind == _LEFT_FN:
        return source[:n]
    return source[size - n :]  # right


def _split(source: str, delimiter: str) -> str:
    """``split``: the pieces between delimiters, empty ones dropped, with nats-server's
    rule for where separators go (a piece is preceded by one unless it opens the token
    or follows only empty pieces at the start)."""
    pieces = source.split(delimiter) if delimiter else list(source)
    out: list[str] = []
    last = len(pieces) - 1
    for j, piece in enumerate(pieces):
        out.append(piece)
        if j < last and pieces[j + 1] and not (j == 0 and not piece):
            out.append(".")
    return "".join(out)


def _tokens_match(filter_tokens: list[str], tokens: list[str]) -> bool:
    for i, f in enumerate(filter_tokens):
        if f == ">":
            return len(tokens) > i
        if i >= len(tokens) or (f != "*" and f != tokens[i]):
            return False
    return len(tokens) == len(filter_tokens)


def validate_mapping(src: str, dest: str) -> None:
    """nats-server's ``ValidateMapping``: the checks a stream, source or mirror
    transform passes; raises :class:`TransformError` with nats-server's text."""
    if not dest:
        return
    full = False
    for token in dest.split("."):
        if not token or full:
            raise _in(INVALID_TRANSFORM, token)
        if len(token) > 4 and token.startswith("{{") and token.endswith("}}"):
            if not any(p.search(token) for p in _VALIDATED):
                raise _in(UNKNOWN_FUNCTION, token)
            continue
        if token == ">":
            full = True
        elif any(c in token for c in "\t\n\f\r "):
            raise TransformError(INVALID_TRANSFORM)
    SubjectTransform(src, dest)
