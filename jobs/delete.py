"""`spark-submit jobs/delete.py --config conf/x.toml ...`: runs sweeper.jobs.delete, the package's entry point."""

from __future__ import annotations

import sys

from sweeper.jobs.delete import main

if __name__ == "__main__":
    sys.exit(main())
