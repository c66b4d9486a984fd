"""Console entry point. Ctrl-C during start-up (imports take a moment) must
end the program quietly, not with a KeyboardInterrupt traceback: until main()
installs its own handling, SIGINT keeps its default action."""

import signal
import sys


def run() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from pstate.main import main

    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
