from pstate.main import main

main()
