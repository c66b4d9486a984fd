"""Snapshot files: writing them safely, and the one snapshot reader."""
