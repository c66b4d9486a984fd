"""Analysis of streams and snapshots: time in state, latency distributions, snapshot series."""
