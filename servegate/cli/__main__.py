"""`python -m servegate.cli` runs the `gate` command."""

from servegate.cli.app import console_main

console_main()
