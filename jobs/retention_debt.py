"""`spark-submit jobs/retention_debt.py --config conf/x.toml ...`: runs sweeper.jobs.retention_debt."""

from __future__ import annotations

import sys

from sweeper.jobs.retention_debt import main

if __name__ == "__main__":
    sys.exit(main())
