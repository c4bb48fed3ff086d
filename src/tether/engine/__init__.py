"""The broker engine: subjects, streams, consumers."""
