"""nats-server's configuration format, read into :class:`Item` trees.

The format (nats-server's ``conf`` package, written afresh here): ``key = value``,
``key: value`` or ``key value``; maps ``{}`` and arrays ``[]`` whose entries end at a new
line, ``,`` or ``;``; ``#`` and ``//`` comments; single-quoted raw strings, double-quoted
strings with ``\\t \\n \\r \\" \\\\ \\xHH`` escapes, unquoted strings (which may hold
``:``, as in ``localhost:4222``), ``(`` block strings ending at a ``)`` alone on a line;
booleans ``true yes on`` / ``false no off``; integers with size suffixes (``1k`` is 1000,
``1kb`` is 1024); floats; Zulu datetimes; ``$NAME`` variables (a key defined earlier in an
enclosing map, else the environment); ``include 'file'`` relative to the including file.
A file may be wrapped in one ``{ }`` (JSON-like). Keys keep their case here; nats-server
matches option names case-insensitively, which is the mapping's business.

Nothing here is interpreted as a setting, and the only I/O is reading the file and the
files it includes. Every problem is a :class:`ConfError` naming file, line and column.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from tether.server.conf.values import INT64_MAX, INT64_MIN, SIZE_FACTORS, ConfError, Item, Pos

_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_DIGITS = frozenset("0123456789")
_SIZE_LETTERS = frozenset("kKmMgGtTpPeE")
_NEWLINES = frozenset("\n\r")
_BLANKS = frozenset(" \t")
# Where an unquoted string or a number ends.
_UNQUOTED_END = frozenset("\n\r;,]} \t")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", '"': '"', "\\": "\\"}
_MAX_DEPTH = 64  # nested maps and arrays
_MAX_INCLUDES = 16  # files included within one another
_ZULU = "%Y-%m-%dT%H:%M:%SZ"
_ZULU_TEXT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def parse_text(
    text: str,
    *,
    filename: str = "<config>",
    base_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Item]:
    """The top-level map of ``text``; includes are read relative to ``base_dir`` (the
    file's directory when ``filename`` names one, else the working directory)."""
    if base_dir is None:
        base_dir = Path(filename).parent if filename != "<config>" else Path()
    parser = _Parser(
        text,
        filename,
        Path(base_dir),
        os.environ if environ is None else environ,
        chain=(),
        env_refs=set(),
    )
    return parser.document()


def parse_file(path: str | Path, *, environ: Mapping[str, str] | None = None) -> dict[str, Item]:
    """The top-level map of the file at ``path`` and the files it includes."""
    path = Path(path)
    text = read_text(path)
    parser = _Parser(
        text,
        str(path),
        path.parent,
        os.environ if environ is None else environ,
        chain=(_identity(path),),
        env_refs=set(),
    )
    return parser.document()


def read_text(path: Path, where: Pos | None = None) -> str:
    """The file's text (UTF-8, an optional byte order mark dropped)."""
    if "\x00" in str(path):
        raise ConfError(f"{str(path)!r}: not a file name", where)
    try:
        is_file = path.is_file()
        data = path.read_bytes() if is_file else b""
    except OSError as exc:
        raise ConfError(f"{path}: cannot read: {exc.strerror or exc}", where) from None
    if not is_file:
        raise ConfError(f"{path}: not a file", where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", "replace")
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        raise ConfError("not UTF-8 text", Pos(str(path), line, col)) from None
    return text.removeprefix("\ufeff")


def _identity(path: Path) -> str:
    try:
        return str(path.resolve())
    except (OSError, RuntimeError, ValueError):
        return str(path.absolute())


class _Parser:
    def __init__(
        self,
        text: str,
        filename: str,
        base_dir: Path,
        environ: Mapping[str, str],
        *,
        chain: tuple[str, ...],
        env_refs: set[str],
        depth: int = 0,
    ) -> None:
        self.text = text
        self.file = filename
        self.base_dir = base_dir
        self.environ = environ
        self.chain = chain  # the files being included, outermost first (cycle check)
        self.env_refs = env_refs  # environment variables being expanded (cycle check)
        self.i = 0
        self.depth = depth  # maps and arrays open around here, included files counted
        self._pending_at = 0  # where the \\x escapes not yet decoded begin
        self.scopes: list[dict[str, Item]] = []
        self._line_starts = [0] + [n + 1 for n, c in enumerate(text) if c == "\n"]

    # -- positions and characters ----------------------------------------------------

    def pos(self, at: int | None = None) -> Pos:
        at = self.i if at is None else at
        line = bisect_right(self._line_starts, at)
        return Pos(self.file, line, at - self._line_starts[line - 1] + 1)

    def error(self, message: str, at: int | None = None) -> ConfError:
        return ConfError(message, self.pos(at))

    def peek(self, ahead: int = 0) -> str:
        at = self.i + ahead
        return self.text[at] if at < len(self.text) else ""

    def _at_comment(self) -> bool:
        c = self.peek()
        return c == "#" or (c == "/" and self.peek(1) == "/")

    def _skip_comment(self) -> None:
        while self.i < len(self.text) and self.text[self.i] not in _NEWLINES:
            self.i += 1

    def _skip_blank_lines(self) -> None:
        """Whitespace, new lines and comments."""
        while self.i < len(self.text):
            if self.text[self.i].isspace():
                self.i += 1
            elif self._at_comment():
                self._skip_comment()
            else:
                return

    def _skip_blanks(self) -> None:
        while self.peek() in _BLANKS:
            self.i += 1

    @staticmethod
    def _show(c: str) -> str:
        return "the end of the file" if not c else ("a new line" if c in _NEWLINES else repr(c))

    # -- maps --------------------------------------------------------------------------

    def document(self) -> dict[str, Item]:
        top: dict[str, Item] = {}
        self.scopes.append(top)
        self._entries(top, None)
        return top

    def _entries(self, into: dict[str, Item], opened_at: int | None) -> None:
        """Keys and values up to the ``}`` closing the map opened at ``opened_at`` (or
        to the end of the file for the top level)."""
        closer = "}" if opened_at is not None else ""
        wrapped_at: int | None = None  # the top level's optional JSON-like { }
        while True:
            self._skip_blank_lines()
            c = self.peek()
            if not c:
                if opened_at is not None:
                    raise self.error("this '{' is never closed", opened_at)
                if wrapped_at is not None:
                    raise self.error("this '{' is never closed", wrapped_at)
                return
            if c == "}" and (opened_at is not None or wrapped_at is not None):
                self.i += 1
                if opened_at is not None:
                    return
                wrapped_at = None
                closer = ""
                continue
            if c == "{" and opened_at is None and wrapped_at is None:
                wrapped_at = self.i
                closer = "}"
                self.i += 1
                continue
            key_at = self.i
            key, quoted = self._key()
            if not quoted and key.lower() == "include" and self.peek().isspace():
                self._include(into, key_at)
            else:
                self._separator(key, key_at)
                item = self._value()
                into[key] = Item(item.value, self.pos(key_at), item.raw)
            self._value_end(closer)

    def _key(self) -> tuple[str, bool]:
        start = self.i
        c = self.peek()
        if c in ("'", '"'):
            end = self.text.find(c, start + 1)
            if end < 0:
                raise self.error("this quoted key is never closed", start)
            self.i = end + 1
            return self.text[start + 1 : end], True
        if c in "=:[]{}(),;":
            raise self.error(f"expected a key, found {c!r}")
        while self.i < len(self.text):
            c = self.text[self.i]
            if c.isspace() or c in "=:":
                break
            self.i += 1
        return self.text[start : self.i], False

    def _separator(self, key: str, key_at: int) -> None:
        """``=``, ``:`` or only whitespace between a key and its value. Without a sign the
        value may even sit on a later line, as nats-server allows."""
        while self.peek().isspace():
            self.i += 1
        c = self.peek()
        if not c:
            raise self.error(f"{key!r} has no value", key_at)
        if c in "=:":
            self.i += 1
            self._skip_blanks()
            if self.peek() in _NEWLINES and self.peek():
                raise self.error(f"expected a value after {key!r} {c}, found a new line")

    def _value_end(self, closer: str) -> None:
        self._skip_blanks()
        if self._at_comment():
            self._skip_comment()
        c = self.peek()
        if c and (c in _NEWLINES or c in ";,"):
            self.i += 1
        elif c and c != closer:
            hint = ""
            if c.isalpha() and self.i > 0 and self.text[self.i - 1] in _DIGITS:
                hint = ' (quote durations and other text that starts with a digit: "1.5s")'
            raise self.error(f"expected a new line, ';' or ',' after the value, found {c!r}{hint}")

    # -- values ------------------------------------------------------------------------

    def _value(self) -> Item:
        start = self.i
        c = self.peek()
        if not c or c in _NEWLINES:
            raise self.error(f"expected a value, found {self._show(c)}")
        if c in "[{":
            self.depth += 1
            if self.depth > _MAX_DEPTH:
                raise self.error(f"maps and arrays nested more than {_MAX_DEPTH} deep")
            try:
                return self._array(start) if c == "[" else self._map(start)
            finally:
                self.depth -= 1
        if c == "'":
            end = self.text.find("'", start + 1)
            if end < 0:
                raise self.error("this quoted string is never closed", start)
            self.i = end + 1
            return Item(self.text[start + 1 : end], self.pos(start))
        if c == '"':
            return self._double_quoted(start)
        if c == "(":
            return self._block(start)
        if c == "-" or c in _DIGITS:
            return self._number(start)
        if c == ".":
            raise self.error(
                "a number must start with a digit, not '.' (quote text such as \"./data\")"
            )
        if c in ",;]}":
            raise self.error(f"expected a value, found {c!r}")
        return self._unquoted(start)

    def _array(self, start: int) -> Item:
        self.i += 1
        items: list[Item] = []
        while True:
            self._skip_blank_lines()
            c = self.peek()
            if c == "]":
                self.i += 1
                return Item(items, self.pos(start))
            if not c:
                raise self.error("this '[' is never closed", start)
            if c == ",":
                raise self.error("unexpected ',' in the array")
            items.append(self._value())
            self._skip_blanks()
            if self._at_comment():
                self._skip_comment()
            c = self.peek()
            if c == "]":
                self.i += 1
                return Item(items, self.pos(start))
            if c == "," or (c and c in _NEWLINES):
                self.i += 1
            elif not c:
                raise self.error("this '[' is never closed", start)
            else:
                raise self.error(f"expected ',' or ']' after the array's value, found {c!r}")

    def _map(self, start: int) -> Item:
        self.i += 1
        inner: dict[str, Item] = {}
        self.scopes.append(inner)
        try:
            self._entries(inner, start)
        finally:
            self.scopes.pop()
        return Item(inner, self.pos(start))

    def _escape(self, parts: list[str], pending: bytearray) -> None:
        """One escape after its backslash: ``\\xHH`` bytes gather in ``pending`` (they may
        spell one UTF-8 character together), the rest go to ``parts``."""
        at = self.i - 1
        c = self.peek()
        if c == "x":
            digits = self.text[self.i + 1 : self.i + 3]
            if len(digits) != 2 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"expected two hexadecimal digits after '\\x', got {digits!r}")
            if not pending:
                self._pending_at = at
            pending.append(int(digits, 16))
            self.i += 3
            return
        if c not in _ESCAPES:
            raise self.error(
                f"invalid escape '\\{c}': only \\t, \\n, \\r, \\\", \\\\ and \\xHH are allowed",
                at,
            )
        self._flush(parts, pending)
        parts.append(_ESCAPES[c])
        self.i += 1

    def _flush(self, parts: list[str], pending: bytearray) -> None:
        if pending:
            try:
                parts.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                raise self.error(
                    "the \\x escapes do not spell UTF-8 text", self._pending_at
                ) from None
            pending.clear()

    def _double_quoted(self, start: int) -> Item:
        self.i += 1
        parts: list[str] = []
        pending = bytearray()
        run = self.i
        while True:
            c = self.peek()
            if not c:
                raise self.error("this quoted string is never closed", start)
            if c == '"' or c == "\\":
                if self.i > run:
                    self._flush(parts, pending)
                    parts.append(self.text[run : self.i])
                self.i += 1
                if c == '"':
                    self._flush(parts, pending)
                    return Item("".join(parts), self.pos(start))
                self._escape(parts, pending)
                run = self.i
            else:
                self.i += 1

    def _block(self, start: int) -> Item:
        """``(`` text up to a ``)`` alone on its own line (which ends the value)."""
        search = start + 1
        while True:
            end = self.text.find(")", search)
            if end < 0:
                raise self.error("this '(' block needs a ')' alone on a line to end it", start)
            alone = self.text[end - 1] == "\n" and self.text[end + 1 : end + 2] in ("", "\n")
            if alone:
                self.i = end + 1
                return Item(self.text[start + 1 : end], self.pos(start))
            search = end + 1

    def _unquoted(self, start: int) -> Item:
        self.i = start
        parts: list[str] = []
        pending = bytearray()
        escaped = False
        run = start
        while True:
            c = self.peek()
            if not c or c in _UNQUOTED_END or c in "'\\":
                if self.i > run:
                    self._flush(parts, pending)
                    parts.append(self.text[run : self.i])
                if c == "\\":
                    self.i += 1
                    self._escape(parts, pending)
                    escaped = True
                    run = self.i
                    continue
                self._flush(parts, pending)
                raw = self.text[start : self.i]
                if c == "'":  # nats-server ends an unquoted string at a quote, and drops it
                    self.i += 1
                break
            self.i += 1
        text = "".join(parts)
        if not escaped:
            if text.lower() in _BOOLS:
                return Item(_BOOLS[text.lower()], self.pos(start), raw)
            if text.startswith("$"):
                return self._variable(text[1:], start, raw)
        return Item(text, self.pos(start), raw)

    def _number(self, start: int) -> Item:
        """An integer (with an optional size suffix), a float, a datetime, or, when the
        digits run into other text (``127.0.0.1:4222``, ``500ms``), a string."""
        text = self.text
        at = start + 1 if text[start] == "-" else start
        if at >= len(text) or text[at] not in _DIGITS:
            raise self.error("expected a digit after '-'", at)
        while at < len(text) and text[at] in _DIGITS:
            at += 1
        c = text[at] if at < len(text) else ""
        negative = text[start] == "-"
        if c == "-" and not negative:
            if at - start != 4:
                raise self.error("a date must be written in full Zulu form: 2006-01-02T15:04:05Z")
            return self._datetime(start)
        if c == ".":
            return self._float(start, at + 1)
        if c in _SIZE_LETTERS and c:
            end = at + 1
            while end < len(text) and text[end] in "bBiI":
                end += 1
            if end == len(text) or text[end] in _UNQUOTED_END:
                return self._integer(start, at, end)
            return self._unquoted(start)
        if not c or c in _UNQUOTED_END or negative:
            return self._integer(start, at, at)
        return self._unquoted(start)

    def _integer(self, start: int, digits_end: int, end: int) -> Item:
        suffix = self.text[digits_end:end].lower()
        factor = SIZE_FACTORS.get(suffix)
        if factor is None:
            raise self.error(f"unknown size suffix {self.text[digits_end:end]!r}", digits_end)
        value = int(self.text[start:digits_end]) * factor
        if not INT64_MIN <= value <= INT64_MAX:
            raise self.error(f"integer {self.text[start:end]!r} is out of range", start)
        self.i = end
        return Item(value, self.pos(start), self.text[start:end])

    def _float(self, start: int, after_dot: int) -> Item:
        text = self.text
        end = after_dot
        while end < len(text) and text[end] in _DIGITS:
            end += 1
        if end == after_dot:
            raise self.error("expected a digit after '.'", after_dot)
        if end < len(text) and text[end] == ".":
            # An address: 127.0.0.1, 10.0.0.1:4222.
            while end < len(text) and (text[end] in _DIGITS or text[end] in ".:-"):
                end += 1
            self.i = end
            return Item(text[start:end], self.pos(start), text[start:end])
        self.i = end
        return Item(float(text[start:end]), self.pos(start), text[start:end])

    def _datetime(self, start: int) -> Item:
        raw = self.text[start : start + 20]
        try:
            if not _ZULU_TEXT.fullmatch(raw):
                raise ValueError(raw)
            value = datetime.strptime(raw, _ZULU).replace(tzinfo=UTC)
        except ValueError:
            raise self.error(
                "a date must be written in full Zulu form: 2006-01-02T15:04:05Z", start
            ) from None
        self.i = start + 20
        return Item(value, self.pos(start), raw)

    # -- variables and includes --------------------------------------------------------

    def _variable(self, name: str, start: int, raw: str) -> Item:
        here = self.pos(start)
        if name.startswith("2a$"):  # an unquoted bcrypt hash, kept as written
            return Item("$" + name, here, raw)
        for scope in reversed(self.scopes):
            target = scope.get(name)
            if target is not None:
                target.used = True
                return Item(target.value, here, target.raw)
        if name in self.env_refs:
            raise ConfError(f"variable reference cycle for {name!r}", here)
        if name in self.environ:
            found = self.environ[name]
            if not found.strip():
                return Item(found, here, found)
            self.env_refs.add(name)
            try:
                sub = _Parser(
                    f"value={found}",
                    f"${name}",
                    self.base_dir,
                    self.environ,
                    chain=self.chain,
                    env_refs=self.env_refs,
                    depth=self.depth,
                )
                parsed = sub.document()["value"]
            except ConfError as exc:
                raise ConfError(
                    f"environment variable {name!r} is not a value: {exc.message}", here
                ) from None
            finally:
                self.env_refs.discard(name)
            return Item(parsed.value, here, parsed.raw)
        raise ConfError(
            f"variable reference for {name!r} can not be found "
            "(define it earlier in the file or in the environment)",
            here,
        )

    def _include(self, into: dict[str, Item], key_at: int) -> None:
        self._skip_blanks()
        start = self.i
        c = self.peek()
        if c in ("'", '"'):
            end = self.text.find(c, start + 1)
            if end < 0:
                raise self.error("this quoted file name is never closed", start)
            name = self.text[start + 1 : end]
            self.i = end + 1
        elif not c or c in _NEWLINES or c in "[{(-\\" or c in _DIGITS:
            raise self.error(f"expected a file name after include, found {self._show(c)}")
        else:
            while self.peek() and self.peek() not in "\n\r;} \t'":
                self.i += 1
            name = self.text[start : self.i]
            if self.peek() == "'":
                self.i += 1
        here = self.pos(key_at)
        path = self.base_dir / name
        identity = _identity(path)
        if identity in self.chain:
            raise ConfError(f"include cycle: {name!r} includes itself, directly or not", here)
        if len(self.chain) >= _MAX_INCLUDES:
            raise ConfError(f"includes nested more than {_MAX_INCLUDES} deep", here)
        sub = _Parser(
            read_text(path, here),
            str(path),
            path.parent,
            self.environ,
            chain=(*self.chain, identity),
            env_refs=set(),
            depth=self.depth,
        )
        try:
            included = sub.document()
        except ConfError as exc:
            raise ConfError(f"{exc.message} (included from {here})", exc.pos) from None
        into.update(included)
