"""Pure wire protocols: bytes in, bytes out. No sockets, no engine."""
