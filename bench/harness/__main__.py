"""Entry point: `python3 bench/harness ...` (what bench/run.sh runs) or, from bench/,
`python3 -m harness ...`."""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a directory: make the package importable as `harness`.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from harness.cli import main
else:
    from .cli import main

sys.exit(main())
