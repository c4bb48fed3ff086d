-- Tether's tables in PostgreSQL (see src/tether/storage/postgres.py).
-- Names carry a tether_ prefix so the database may hold other things too.

CREATE TABLE tether_streams (
    name text PRIMARY KEY,
    config bytea NOT NULL,
    created_ns bigint NOT NULL
);

-- Each stream's high-water mark, so the last sequence survives deleting the tail.
CREATE TABLE tether_stream_seq (
    stream text PRIMARY KEY,
    last_seq bigint NOT NULL
);

CREATE TABLE tether_messages (
    stream text NOT NULL,
    seq bigint NOT NULL,
    subject text NOT NULL,
    headers bytea NOT NULL,
    data bytea NOT NULL,
    ts bigint NOT NULL,
    priority integer NOT NULL,
    crc bigint NOT NULL,  -- the checksum of every other column (checksum.py)
    PRIMARY KEY (stream, seq)
);

CREATE TABLE tether_consumers (
    stream text NOT NULL,
    name text NOT NULL,
    config bytea NOT NULL,
    state bytea NOT NULL,
    created_ns bigint NOT NULL,
    PRIMARY KEY (stream, name)
);

-- The one leader row: the fencing epoch. A node that becomes active raises it; every
-- commit checks, in its own transaction, that it still holds the epoch it was given.
CREATE TABLE tether_leader (
    id integer PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    node text NOT NULL,
    since timestamptz NOT NULL
);
INSERT INTO tether_leader (id, epoch, node, since) VALUES (1, 0, '', now());
