"""What the bookies (and the object store) gave back after a run's deletes: measured, and triggered when asked.

By concern: `discovery` (where each bookie's HTTP server is, from its registration), `samples` (reading what a
bookie answers), `bookie_http` (the paced, time-limited client), `decide` (expected shares, deltas, verdicts: pure)
and `stage` (the step the sweep and `sweeper reclaim` run). DESIGN.md invariant 20.
"""
