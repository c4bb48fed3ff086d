"""Tether's own version and the NATS server version it reports to clients."""

__version__ = "0.1.0"

# nats-py picks the modern consumer-create API only for servers >= 2.9, and other
# clients gate features on 2.10+, so we report a 2.x version clients fully support.
NATS_COMPAT_VERSION = "2.11.0"
