"""The broker engine: the semantics of a message broker, with no I/O.

Rooms, top-down (each imports only the ones below it):

* :mod:`~tether.engine.jobs` — webhook-broker's channels, consumers and jobs, a view
  over streams and durable consumers;
* :mod:`~tether.engine.broker` — the facade front doors use: streams, publishing
  through group commit, reads;
* :mod:`~tether.engine.consumers` — durable consumers: cursors, delivery state, acks,
  pull and push delivery, the registry;
* :mod:`~tether.engine.streams` — streams: configuration, the message index, limits,
  retention, deduplication;
* :mod:`~tether.engine.subjects`, :mod:`~tether.engine.clock`,
  :mod:`~tether.engine.errors` — subjects and their index, time, API errors.
"""
