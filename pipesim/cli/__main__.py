"""`python -m pipesim.cli`."""

from . import main

main()
