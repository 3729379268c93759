"""`python -m rlxviz.cli ...`: the `rlxviz` command line."""

from .entry import main

raise SystemExit(main())
