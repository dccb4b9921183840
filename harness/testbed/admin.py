"""A small client for the broker's admin REST (v2), authenticated with the testbed's superuser token."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import requests


class AdminError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


def topic_path(topic: str) -> str:
    """`persistent://t/ns/local` -> `persistent/t/ns/<local, percent-encoded>` for the REST path."""
    domain, rest = topic.split("://", 1)
    tenant, namespace, local = rest.split("/", 2)
    return f"{domain}/{tenant}/{namespace}/{urllib.parse.quote(local, safe='')}"


class Admin:
    def __init__(self, admin_url: str, token: str, timeout: float = 30.0) -> None:
        self.base = admin_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 204),
             params: dict[str, Any] | None = None) -> Any:
        response = self.session.request(method, self.base + path, timeout=self.timeout, params=params,
                                        data=None if body is None else json.dumps(body),
                                        headers={"Content-Type": "application/json"} if body is not None else {})
        if response.status_code not in ok:
            raise AdminError(method, path, response.status_code, response.text)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    # -- tenants and namespaces ---------------------------------------------------------------
    def ensure_tenant(self, tenant: str, cluster: str) -> None:
        self.call("PUT", f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster]},
                  ok=(200, 204, 409))

    def ensure_namespace(self, namespace: str) -> None:
        self.call("PUT", f"/admin/v2/namespaces/{namespace}", ok=(200, 204, 409))

    def namespace_policy(self, namespace: str, policy: str, value: Any, method: str = "POST") -> None:
        self.call(method, f"/admin/v2/namespaces/{namespace}/{policy}", value)

    # -- topics -------------------------------------------------------------------------------
    def create_topic(self, topic: str, properties: dict[str, str] | None = None) -> None:
        self.call("PUT", f"/admin/v2/{topic_path(topic)}", properties, ok=(200, 204, 409))

    def create_partitioned(self, topic: str, partitions: int) -> None:
        self.call("PUT", f"/admin/v2/{topic_path(topic)}/partitions", partitions, ok=(200, 204, 409))

    def partitions(self, topic: str) -> int:
        return int(self.call("GET", f"/admin/v2/{topic_path(topic)}/partitions")["partitions"])

    def list_topics(self, namespace: str) -> list[str]:
        return list(self.call("GET", f"/admin/v2/persistent/{namespace}"))

    def delete_topic(self, topic: str) -> None:
        self.call("DELETE", f"/admin/v2/{topic_path(topic)}", params={"force": "true"}, ok=(200, 204, 404))

    def unload(self, topic: str) -> None:
        self.call("PUT", f"/admin/v2/{topic_path(topic)}/unload")

    def internal_stats(self, topic: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/admin/v2/{topic_path(topic)}/internalStats",
                              params={"metadata": "true"}))

    def stats(self, topic: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/admin/v2/{topic_path(topic)}/stats"))

    def pending_ack_internal_stats(self, topic: str, subscription: str) -> dict[str, Any]:
        """The stats-internal of a subscription's transaction pending-ack store (its managed ledger and cursor).

        The store's own topic (`<topic>-<sub>__transaction_pending_ack`) has no `internalStats` of its own: the
        broker refuses to load a transaction system topic through the admin API (HTTP 409), so this asks the
        transactions endpoint, which reports the store as the subscription's topic opened it."""
        _, rest = topic.split("://", 1)
        return dict(self.call("GET", f"/admin/v3/transactions/pendingAckInternalStats/{rest}/"
                                     f"{urllib.parse.quote(subscription, safe='')}"))

    def create_subscription(self, topic: str, subscription: str, earliest: bool = True) -> None:
        position = {"ledgerId": 0, "entryId": 0, "partitionIndex": -1} if earliest else None
        self.call("PUT", f"/admin/v2/{topic_path(topic)}/subscription/{urllib.parse.quote(subscription, safe='')}",
                  position, ok=(200, 204, 409))

    def skip_all(self, topic: str, subscription: str) -> None:
        """Acknowledge everything (the cursor's mark-delete moves to the end)."""
        self.call("POST", f"/admin/v2/{topic_path(topic)}/subscription/"
                          f"{urllib.parse.quote(subscription, safe='')}/skip_all")

    def set_shadow_topics(self, source: str, shadows: list[str]) -> None:
        self.call("PUT", f"/admin/v2/{topic_path(source)}/shadowTopics", shadows)

    # -- compaction and offload (asynchronous on the broker: wait for the status) ------------------
    def compact(self, topic: str, timeout: float = 120.0) -> None:
        self.call("PUT", f"/admin/v2/{topic_path(topic)}/compaction", ok=(200, 204, 409))
        self._wait(f"/admin/v2/{topic_path(topic)}/compaction", "compaction", timeout)

    def offload(self, topic: str, ledger_id: int, entry_id: int, timeout: float = 60.0) -> None:
        self.call("PUT", f"/admin/v2/{topic_path(topic)}/offload",
                  {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1})
        self._wait(f"/admin/v2/{topic_path(topic)}/offload", "offload", timeout)

    def _wait(self, path: str, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.call("GET", path)
            if status.get("status") == "SUCCESS":
                return
            if status.get("status") == "ERROR":
                raise AdminError("GET", path, 200, f"{what} failed: {status.get('lastError')}")
            if time.monotonic() > deadline:
                raise AdminError("GET", path, 200, f"{what} not done after {timeout:.0f}s: {status}")
            time.sleep(0.3)

    # -- schemas ------------------------------------------------------------------------------
    def schema_versions(self, topic: str) -> list[dict[str, Any]]:
        _, rest = topic.split("://", 1)
        tenant, namespace, local = rest.split("/", 2)
        path = f"/admin/v2/schemas/{tenant}/{namespace}/{urllib.parse.quote(local, safe='')}/schemas"
        return list(self.call("GET", path, ok=(200,)).get("getSchemaResponses", []))

    def schema(self, topic: str, version: int) -> dict[str, Any]:
        _, rest = topic.split("://", 1)
        tenant, namespace, local = rest.split("/", 2)
        return dict(self.call("GET", f"/admin/v2/schemas/{tenant}/{namespace}/"
                                     f"{urllib.parse.quote(local, safe='')}/schema/{version}"))
