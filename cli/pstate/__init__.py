"""pstate: scheduler state transitions of processes and threads, observed with BPF."""

__version__ = "0.1.0"
