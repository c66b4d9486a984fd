"""The event format: schema, its vocabulary, the one reader, writers, meta records, filters, durations, time windows, replay."""
