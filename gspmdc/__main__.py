"""`python -m gspmdc` is the `gspmdc` command."""
import sys

from gspmdc.cli import main

sys.exit(main())
