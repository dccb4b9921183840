"""`spark-submit jobs/emit.py --config conf/x.toml ...`: runs sweeper.jobs.emit, the package's entry point."""

from __future__ import annotations

import sys

from sweeper.jobs.emit import main

if __name__ == "__main__":
    sys.exit(main())
