"""The reconcile stage and the data-quality gates that run before it."""
