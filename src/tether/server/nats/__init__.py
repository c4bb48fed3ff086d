"""The NATS client protocol front door."""
