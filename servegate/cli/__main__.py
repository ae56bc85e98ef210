"""`python -m servegate.cli` runs the `gate` command."""

from servegate.cli.app import main

main()
