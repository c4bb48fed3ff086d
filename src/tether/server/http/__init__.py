"""The HTTP front door: monitoring now, the webhook-broker compatible API later."""
