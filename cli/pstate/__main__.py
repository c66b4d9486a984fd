from pstate.entry import run

run()
