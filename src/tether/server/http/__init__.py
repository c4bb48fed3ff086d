"""The HTTP front door: webhook-broker's API, Tether's job extensions, monitoring and metrics."""
