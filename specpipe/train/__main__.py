"""`python -m specpipe.train` runs the console script."""

from specpipe.train.drafter import main

main()
