"""``python -m kiln``: the same command line as ``kiln``."""

from kiln._cli import main

raise SystemExit(main())
