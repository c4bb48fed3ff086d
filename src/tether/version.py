"""Tether's own version and the NATS server version it reports to clients."""

__version__ = "0.1.0"

# Clients gate features on this version (nats-py's consumer-create API on >= 2.9, nats.js's
# consumer reset on >= 2.14): Tether reports the release whose JetStream features it
# serves, at the API level of that release (``API_LEVEL`` in tether.server.nats.requests).
NATS_COMPAT_VERSION = "2.14.0"
