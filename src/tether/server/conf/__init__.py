"""nats-server configuration files: the format (``parser``), what it parses into
(``values``) and how its keys become Tether's settings (``mapping``)."""

from tether.server.conf.parser import parse_file, parse_text
from tether.server.conf.values import ConfError, Item, Pos, parse_duration, to_plain

__all__ = ["ConfError", "Item", "Pos", "parse_duration", "parse_file", "parse_text", "to_plain"]
