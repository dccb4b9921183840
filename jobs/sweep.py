"""`spark-submit jobs/sweep.py --config conf/x.toml ...`: runs sweeper.jobs.sweep, the package's entry point."""

from __future__ import annotations

import sys

from sweeper.jobs.sweep import main

if __name__ == "__main__":
    sys.exit(main())
