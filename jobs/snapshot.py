"""`spark-submit jobs/snapshot.py --config conf/x.toml ...`: runs sweeper.jobs.snapshot, the package's entry point."""

from __future__ import annotations

import sys

from sweeper.jobs.snapshot import main

if __name__ == "__main__":
    sys.exit(main())
