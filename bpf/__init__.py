"""BPF C sources of pstate, shipped as package data (read with importlib.resources)."""
