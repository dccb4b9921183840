"""`spark-submit jobs/reconcile.py --config conf/x.toml ...`: runs sweeper.jobs.reconcile, the package's entry point."""

from __future__ import annotations

import sys

from sweeper.jobs.reconcile import main

if __name__ == "__main__":
    sys.exit(main())
