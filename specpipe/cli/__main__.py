"""`python -m specpipe.cli ...` is `specpipe ...` (what tests and scripts run without the console script)."""

from specpipe.cli.generate import main

main()
