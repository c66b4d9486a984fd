"""Console entry point (and `python -m pstate`). The signal helper is
installed first, before the imports that take a moment: a signal from the
first moment on ends pstate with its documented exit status, never a
traceback or a death by the signal half-way through a file
(pstate.lifecycle)."""

def run() -> None:
    from pstate import lifecycle

    lifecycle.install()
    from pstate.main import main

    main()
