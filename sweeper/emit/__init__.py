"""PIP-186 phase 1: the emit stage."""
