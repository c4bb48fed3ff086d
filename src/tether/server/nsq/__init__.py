"""The NSQ front door: nsqd's TCP protocol (V2) over the engine's NSQ model."""
