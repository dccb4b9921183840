"""The Spark jobs as spark-submit takes them, a file each: tiny wrappers of `sweeper.jobs` (the package has the
code, so an installed wheel runs them too). Not installed: the wheel's only top-level package is `sweeper`."""
