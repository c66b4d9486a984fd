"""The kernel side: BPF loading, the program cache, bpf(2) calls, kernel headers, state decoding."""
