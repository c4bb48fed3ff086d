-- Streams with compression "s2" store their payloads compressed (see compression.py).
-- The stream's setting, so the writer knows it from the start:
ALTER TABLE tether_streams ADD COLUMN compression text NOT NULL DEFAULT 'none';
-- NULL: data holds the payload as sent (every row written before this migration);
-- else data holds it in the Snappy block format, and this is its size decompressed.
ALTER TABLE tether_messages ADD COLUMN plain_size bigint;
