"""Message schedules (ADR-51) and the one timetable every delayed delivery shares.

A message stored on a stream with ``allow_msg_schedules`` and carrying
``Nats-Schedule`` is a *schedule*: when it is due, the stream stores a copy of it on
``Nats-Schedule-Target`` (the *produced* message). Patterns are nats-server 2.14's:
``@at <RFC3339>`` (once), ``@every <Go duration>`` (at least 1s), the ``@hourly`` …
``@yearly`` shorthands and six-field cron (``sec min hour dom month dow``) read in
``Nats-Schedule-Time-Zone``.

Exactly once across crashes, with no state of its own: a produced message records
when the schedule fires next (``Nats-Schedule-Next``), and for ``@at`` it is
``purge``, which removes the schedule in the same commit as the produced message. So
after a restart the schedules are the last message of their subjects, and the next
fire time is the one the last produced message wrote (see :class:`ScheduleBook`).

:class:`Timetable` is the engine's single timer heap for delayed work: stream
schedules and the webhook-broker's ``X-Broker-Scheduled-For`` messages both wait in it.
"""

from __future__ import annotations

import calendar
import datetime as dt
import heapq
import re
import zoneinfo
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from tether.engine.clock import Clock, Timer
from tether.engine.errors import ApiError
from tether.engine.subjects import is_literal, is_subset, subject_matches

NS = 1_000_000_000

SCHEDULE = b"Nats-Schedule"
TARGET = b"Nats-Schedule-Target"
SOURCE = b"Nats-Schedule-Source"
TIME_ZONE = b"Nats-Schedule-Time-Zone"
SCHEDULE_TTL = b"Nats-Schedule-TTL"
SCHEDULE_ROLLUP = b"Nats-Schedule-Rollup"
NEXT = b"Nats-Schedule-Next"
SCHEDULER = b"Nats-Scheduler"
ROLLUP = b"Nats-Rollup"
PURGE = b"purge"


def disabled() -> ApiError:
    return ApiError(400, 10188, "message schedules is disabled")


def invalid_pattern() -> ApiError:
    return ApiError(400, 10189, "message schedules pattern is invalid")


def invalid_target() -> ApiError:
    return ApiError(400, 10190, "message schedules target is invalid")


def invalid_ttl() -> ApiError:
    return ApiError(400, 10191, "message schedules invalid per-message TTL")


def invalid_rollup() -> ApiError:
    return ApiError(400, 10192, "message schedules invalid rollup")


def invalid_source() -> ApiError:
    return ApiError(400, 10203, "message schedules source is invalid")


def invalid_scheduler() -> ApiError:
    return ApiError(400, 10212, "message schedules invalid scheduler")


def invalid_time_zone() -> ApiError:
    return ApiError(400, 10223, "message schedules time zone is invalid")


# -- patterns ------------------------------------------------------------------------------
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
_SHORTHANDS = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS = {d.lower(): (i + 1) % 7 for i, d in enumerate(calendar.day_abbr)}  # sun = 0
# (low, high, names) per cron field: sec, min, hour, day of month, month, day of week.
_FIELDS: tuple[tuple[int, int, dict[str, int]], ...] = (
    (0, 59, {}),
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (1, 12, _MONTHS),
    (0, 6, _DAYS),
)


def parse_rfc3339(text: str) -> int | None:
    """Go's ``time.Parse(time.RFC3339, text)`` in ns since the epoch, or None."""
    if not _RFC3339.fullmatch(text):
        return None
    norm = text.upper().replace("Z", "+00:00")
    frac = ""
    if "." in norm:
        head, rest = norm.split(".", 1)
        digits = re.match(r"[0-9]+", rest)
        assert digits is not None
        frac = digits.group(0)
        norm = head + rest[len(frac) :]
    try:
        when = dt.datetime.fromisoformat(norm)
    except ValueError:
        return None
    ns = int(frac[:9].ljust(9, "0")) if frac else 0
    return calendar.timegm(when.utctimetuple()) * NS + ns


def parse_duration(text: str) -> int | None:
    """A Go duration (``1s``, ``1h30m``, ``1.5m``) in ns, or None."""
    pos = 0
    total = 0.0
    if not text:
        return None
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    if pos != len(text) or total >= 2**63:
        return None
    return int(total)


class Cron:
    """A six-field cron expression (robfig/cron's reading, as nats-server uses it)."""

    __slots__ = ("dom_star", "dow_star", "fields")

    def __init__(self, fields: tuple[frozenset[int], ...], dom_star: bool, dow_star: bool) -> None:
        self.fields = fields
        self.dom_star = dom_star
        self.dow_star = dow_star

    @classmethod
    def parse(cls, text: str) -> Cron | None:
        parts = text.split()
        if len(parts) != 6:
            return None
        sets: list[frozenset[int]] = []
        for part, (low, high, names) in zip(parts, _FIELDS, strict=True):
            values = _cron_field(part.lower(), low, high, names)
            if values is None:
                return None
            sets.append(values)
        return cls(tuple(sets), parts[3][0] in "*?", parts[5][0] in "*?")

    def _day_matches(self, day: dt.datetime) -> bool:
        dom = day.day in self.fields[3]
        dow = (day.isoweekday() % 7) in self.fields[5]
        if self.dom_star or self.dow_star:
            return dom and dow
        return dom or dow

    def next_after(self, ns: int, zone: dt.tzinfo) -> int:
        """The first time strictly after ``ns`` the expression matches (ns), or 0."""
        secs, mins, hours, _, months, _ = self.fields
        t = dt.datetime.fromtimestamp(ns // NS + 1, zone).replace(tzinfo=None)
        limit = t.year + 5
        while t.year <= limit:
            if t.month not in months:
                year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
                t = dt.datetime(year, month, 1)
                continue
            if not self._day_matches(t):
                t = dt.datetime(t.year, t.month, t.day) + dt.timedelta(days=1)
                continue
            if t.hour not in hours:
                t = t.replace(minute=0, second=0) + dt.timedelta(hours=1)
                continue
            if t.minute not in mins:
                t = t.replace(second=0) + dt.timedelta(minutes=1)
                continue
            if t.second not in secs:
                t += dt.timedelta(seconds=1)
                continue
            # A wall time the clock goes back over (daylight saving's end) happens twice:
            # the first occurrence may be past while the second is not.
            for fold in (0, 1):
                when = int(t.replace(tzinfo=zone, fold=fold).timestamp()) * NS
                if when > ns:
                    return when
            t += dt.timedelta(seconds=1)
        return 0


def _cron_field(part: str, low: int, high: int, names: dict[str, int]) -> frozenset[int] | None:
    out: set[int] = set()
    for item in part.split(","):
        step = 1
        if "/" in item:
            item, _, raw_step = item.partition("/")
            if not raw_step.isdigit() or int(raw_step) == 0:
                return None
            step = int(raw_step)
        if item in ("*", "?"):
            lo, hi = low, high
        else:
            a, dash, b = item.partition("-")
            lo_v = _cron_value(a, names)
            hi_v = _cron_value(b, names) if dash else lo_v
            if lo_v is None or hi_v is None:
                return None
            lo, hi = lo_v, hi_v
            if "/" in part and not dash:
                hi = high  # "a/n": from a to the end, every n
        if lo < low or hi > high or lo > hi:
            return None
        out.update(range(lo, hi + 1, step))
    return frozenset(out)


def _cron_value(text: str, names: dict[str, int]) -> int | None:
    if text in names:
        return names[text]
    return int(text) if text.isdigit() else None


@dataclass(slots=True)
class Pattern:
    """A parsed ``Nats-Schedule`` value."""

    kind: str  # "at", "every" or "cron"
    at_ns: int = 0
    every_ns: int = 0
    cron: Cron | None = None
    zone: dt.tzinfo = dt.UTC
    zone_name: str = ""

    def first_due(self, stored_ns: int) -> int:
        """When a schedule stored at ``stored_ns`` first fires."""
        if self.kind == "at":
            return self.at_ns
        return self.next_after(stored_ns)

    def next_after(self, ns: int) -> int:
        """The fire after one at ``ns`` (0: never again)."""
        if self.kind == "at":
            return 0
        if self.kind == "every":
            return (ns // NS) * NS + self.every_ns
        assert self.cron is not None
        return self.cron.next_after(ns, self.zone)

    def stamp(self, ns: int) -> str:
        """``Nats-Schedule-Next`` for a fire at ``ns``: RFC 3339 in the schedule's zone."""
        when = dt.datetime.fromtimestamp(ns // NS, self.zone if self.zone_name else dt.UTC)
        text = when.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") and not self.zone_name else text


def parse_pattern(value: str, time_zone: str | None) -> Pattern:
    """A ``Nats-Schedule`` value with its ``Nats-Schedule-Time-Zone``; raises 10189/10223."""
    if value.startswith("@at "):
        if time_zone is not None:
            raise invalid_pattern()
        at = parse_rfc3339(value[4:])
        if at is None:
            raise invalid_pattern()
        return Pattern("at", at_ns=at)
    if value.startswith("@every "):
        if time_zone is not None:
            raise invalid_pattern()
        every = parse_duration(value[7:])
        if every is None or every < NS:
            raise invalid_pattern()
        return Pattern("every", every_ns=every)
    cron = Cron.parse(_SHORTHANDS.get(value, value))
    if cron is None:
        raise invalid_pattern()
    pattern = Pattern("cron", cron=cron)
    if time_zone is not None:
        pattern.zone = _zone(time_zone)
        pattern.zone_name = time_zone
    return pattern


def _zone(name: str) -> dt.tzinfo:
    if name == "UTC":
        return dt.UTC
    if name == "Local":
        local = dt.datetime.now().astimezone().tzinfo
        return local if local is not None else dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise invalid_time_zone() from None


# -- schedules of a stream -----------------------------------------------------------------------
@dataclass(slots=True)
class Schedule:
    """A live schedule: the last message of its subject."""

    stream: str
    subject: str
    seq: int
    pattern: Pattern
    target: str
    source: str
    ttl: str
    rollup: str
    due_ns: int = 0


def check_publish(
    subject: str,
    stream_subjects: list[str],
    allow_schedules: bool,
    allow_msg_ttl: bool,
    fields: dict[bytes, bytes],
    ttl_valid: Callable[[str], bool],
) -> Schedule | None:
    """A publish carrying ``Nats-Schedule``: the schedule it sets, checked in
    nats-server's order (raises its errors). None when it carries none."""
    raw = fields.get(SCHEDULE)
    if not raw:
        return None
    if not allow_schedules:
        raise disabled()
    tz = fields.get(TIME_ZONE)
    if tz is not None and not tz:
        raise invalid_time_zone()
    pattern = parse_pattern(
        raw.decode(errors="replace"), tz.decode(errors="replace") if tz else None
    )
    ttl = fields.get(SCHEDULE_TTL, b"").decode(errors="replace")
    if ttl and not ttl_valid(ttl):
        raise invalid_ttl()
    rollup = fields.get(SCHEDULE_ROLLUP, b"").decode(errors="replace")
    if rollup and rollup != "sub":
        raise invalid_rollup()
    if ttl and not allow_msg_ttl:
        raise ApiError(400, 10166, "per-message TTL is disabled")
    target = fields.get(TARGET, b"").decode(errors="replace")
    if not _inside(target, subject, stream_subjects):
        raise invalid_target()
    source = fields.get(SOURCE, b"").decode(errors="replace")
    if source and (source == target or not _inside(source, subject, stream_subjects)):
        raise invalid_source()
    own_rollup = fields.get(ROLLUP)
    if own_rollup is not None and own_rollup != b"sub":
        raise invalid_rollup()
    return Schedule("", subject, 0, pattern, target, source, ttl, rollup)


def _inside(target: str, subject: str, stream_subjects: list[str]) -> bool:
    return (
        bool(target)
        and is_literal(target)
        and target != subject
        and any(subject_matches(f, target) or is_subset(target, f) for f in stream_subjects)
    )


def check_stop(
    subject: str,
    allow_schedules: bool,
    fields: dict[bytes, bytes],
    is_schedule: Callable[[str], bool],
) -> str:
    """A client stopping a schedule (``Nats-Schedule-Next: purge`` with
    ``Nats-Scheduler``): the schedule subject to purge, "" if the publish is not one."""
    scheduler = fields.get(SCHEDULER)
    nxt = fields.get(NEXT)
    if scheduler is None and nxt is None:
        return ""
    if not allow_schedules:
        raise disabled()
    name = (scheduler or b"").decode(errors="replace")
    if nxt is None or not name or not is_literal(name) or name == subject:
        raise invalid_scheduler()
    if not is_schedule(name):
        raise invalid_scheduler()
    if nxt == PURGE:
        return name
    # A message a repeating schedule produced (it names the next fire): stored as is.
    if parse_rfc3339(nxt.decode(errors="replace")) is None:
        raise invalid_scheduler()
    return ""


def with_rollup(headers: bytes) -> bytes:
    """A schedule is stored with ``Nats-Rollup: sub`` (a newer one replaces it)."""
    return headers[:-2] + b"Nats-Rollup: sub\r\n\r\n"


_DROPPED = (b"Nats-Schedule", b"Nats-Expected-", b"Nats-Msg-Id", b"Nats-TTL", b"Nats-Rollup")


def produced_headers(headers: bytes, schedule: Schedule, next_ns: int) -> bytes:
    """The header block of the message a schedule produces."""
    lines = [b"NATS/1.0"]
    for line in headers.split(b"\r\n")[1:]:
        if not line:
            continue
        key = line.partition(b":")[0].strip()
        if key.startswith(_DROPPED) or key == SCHEDULER:
            continue
        lines.append(line)
    lines.append(b"Nats-Scheduler: " + schedule.subject.encode())
    stamp = schedule.pattern.stamp(next_ns) if next_ns else "purge"
    lines.append(b"Nats-Schedule-Next: " + stamp.encode())
    if schedule.ttl:
        lines.append(b"Nats-TTL: " + schedule.ttl.encode())
    if schedule.rollup:
        lines.append(b"Nats-Rollup: " + schedule.rollup.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def next_from_produced(fields: dict[bytes, bytes]) -> int | None:
    """What a produced message says about its schedule: the next fire (ns), 0 for
    ``purge`` (done), None if it says nothing readable."""
    raw = fields.get(NEXT)
    if raw is None:
        return None
    if raw == PURGE:
        return 0
    return parse_rfc3339(raw.decode(errors="replace"))


# -- the shared timetable ----------------------------------------------------------------------
class Timetable:
    """Work due at a wall-clock time, one timer for all of it.

    ``set(key, due_ns, fn)`` replaces any earlier entry for ``key``; ``fn`` runs once,
    on the clock's loop, at or after ``due_ns``. Entries are a heap with lazy deletion
    (a replaced or cancelled entry stays in the heap until it comes up), so setting and
    cancelling cost O(log n) and nothing is ever scanned.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[int, int, Hashable]] = []
        self._entries: dict[Hashable, tuple[int, int, Callable[[], None]]] = {}
        self._counter = 0
        self._timer: Timer | None = None
        self._timer_at = 0

    def __len__(self) -> int:
        return len(self._entries)

    def due(self, key: Hashable) -> int:
        entry = self._entries.get(key)
        return entry[0] if entry else 0

    def set(self, key: Hashable, due_ns: int, fn: Callable[[], None]) -> None:
        self._counter += 1
        self._entries[key] = (due_ns, self._counter, fn)
        heapq.heappush(self._heap, (due_ns, self._counter, key))
        self._arm()

    def cancel(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._entries.clear()
        self._heap.clear()

    def _arm(self) -> None:
        heap = self._heap
        entries = self._entries
        while heap:
            due, n, key = heap[0]
            entry = entries.get(key)
            if entry is not None and entry[1] == n:
                break
            heapq.heappop(heap)
        if not heap:
            return
        due = heap[0][0]
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer_at = due
        self._timer = self.clock.call_later(max(0.0, (due - self.clock.now()) / 1e9), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.clock.now()
        heap = self._heap
        entries = self._entries
        ready: list[Callable[[], None]] = []
        while heap and heap[0][0] <= now:
            _, n, key = heapq.heappop(heap)
            entry = entries.get(key)
            if entry is not None and entry[1] == n:
                del entries[key]
                ready.append(entry[2])
        for fn in ready:
            fn()
        self._arm()
