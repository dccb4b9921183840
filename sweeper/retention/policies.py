"""Topic-level retention and TTL, asked of the broker (`[retention] topic_policies = "admin"`): what the
retention-debt step judges with, and what a repair could re-check. A library both may use (no stage imports
another)."""

from __future__ import annotations

import time
from collections.abc import Callable

from sweeper.broker.errors import RedirectRefused, SystemTopicError
from sweeper.broker.system_topic import AdminClient
from sweeper.ratelimit import TokenBucket
from sweeper.vocabulary import UNREAD


class TopicPolicyLookup:
    """[retention] topic_policies = "admin": the broker's answer per topic, paced like the repair's calls. Once
    the admin API is unreachable the rest are `unread` without asking (their topics stay `unknown`): a broker
    we cannot reach never stops the run, and never makes a topic look expired."""

    def __init__(self, admin: AdminClient, per_second: float, sleep: Callable[[float], None] = time.sleep) -> None:
        self.admin, self.pacer, self.failure = admin, TokenBucket(per_second, sleep=sleep), ""

    def __call__(self, topic_name: str) -> tuple[str, str]:
        if self.failure:
            return UNREAD, f"not asked: {self.failure}"
        self.pacer.acquire(1)
        try:
            return self.admin.topic_policy(topic_name)
        except RedirectRefused as exc:
            return UNREAD, str(exc)  # this topic's namespace is served elsewhere: the others may still be asked
        except SystemTopicError as exc:
            self.failure = str(exc)
            return UNREAD, self.failure
