"""The event format: schema, the one reader, writers, meta records, filters, durations, time windows, replay."""
