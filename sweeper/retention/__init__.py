"""Retention debt (the blog's cases 2 and 3): the debt stage, its repair through the admin API, the repair's
journal and the broker's topic policies."""
