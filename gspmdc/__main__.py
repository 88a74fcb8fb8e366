"""`python -m gspmdc` is the `gspmdc` command."""
from gspmdc.cli import console_main

console_main()
