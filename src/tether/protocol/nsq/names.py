"""Topic and channel names as nsqd accepts them: 1 to 64 characters of
``[.a-zA-Z0-9_-]``, optionally ending in ``#ephemeral``."""

from __future__ import annotations

import re

EPHEMERAL = "#ephemeral"
MAX_NAME_LENGTH = 64
_NAME = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


def is_valid_name(name: bytes) -> bool:
    """Whether ``name`` is a valid topic or channel name."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL)
