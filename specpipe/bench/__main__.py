"""`python -m specpipe.bench` runs the console script."""

from specpipe.bench.harness import main

main()
