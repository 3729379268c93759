"""`python -m rlxviz ...`: the same command line as the `rlxviz` script."""

from .cli import main

raise SystemExit(main())
