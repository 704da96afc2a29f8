"""`python -m harness.cli`: the same as the `harness` script."""

from harness.cli import main

main()
