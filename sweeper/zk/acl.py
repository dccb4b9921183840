"""Which ZooKeeper permissions a delete run needs, and whether this session has them, before it starts.

A delete run that meets a missing permission half way has deleted some ledgers and not others;
checking first (getACL on every znode the run will touch, against the session's own identities
from whoAmI) refuses such a run before anything is deleted, naming the znode and the permission.
The check is best effort: where it cannot tell (an older server without whoAmI, an ACL we may
not read), the deletes themselves still treat NoAuth as a refusal of the whole run.

Rules (ZooKeeperServer.checkACL, ZooKeeper 3.8): an empty ACL allows all; a `super` session is
allowed all; otherwise some ACL entry with the permission bit must be `world:anyone` or match one
of the session's ids of the same scheme (exact match for digest, sasl, x509; address and mask for
ip). Deleting a znode needs DELETE on its *parent*; reading, and `check` in a multi, need READ on
the znode itself. getACL needs READ or ADMIN; without ADMIN it shows digest ids as `user:x`
(FinalRequestProcessor). Pure functions: the reads are in sweeper.delete.permissions.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

READ, WRITE, CREATE, DELETE, ADMIN = 1, 2, 4, 8, 16
PERMISSION_NAMES = {READ: "READ", WRITE: "WRITE", CREATE: "CREATE", DELETE: "DELETE", ADMIN: "ADMIN"}

AclEntry = tuple[int, str, str]  # (perms, scheme, id)
# getACL itself was refused: it needs READ or ADMIN, so READ is surely missing (other bits unknown).
UNREADABLE = "unreadable"
Acl = list[AclEntry] | str | None  # entries, UNREADABLE, or None (no such znode: nothing to check)


@dataclass(frozen=True)
class Identity:
    """The ids a session holds, as (scheme, id) pairs in the form ACLs use."""

    ids: frozenset[tuple[str, str]]

    @property
    def is_super(self) -> bool:
        return any(scheme == "super" for scheme, _ in self.ids)

    def describe(self) -> str:
        shown = sorted(f"{s}:{i.split(':', 1)[0] if s == 'digest' else i}" for s, i in self.ids if s != "ip")
        return ", ".join(shown) or "no authenticated identity"


def identity_of(who_am_i: Iterable[tuple[str, str]], digest_id: str = "") -> Identity:
    """The session's ids from whoAmI. whoAmI names a digest user without its password hash
    (AuthUtil.getClientInfos): our own full id, computed from the credentials we sent, stands in."""
    ids = set()
    for scheme, user in who_am_i:
        if scheme == "digest" and digest_id and digest_id.split(":", 1)[0] == user:
            ids.add(("digest", digest_id))
        else:
            ids.add((scheme, user))
    return Identity(frozenset(ids))


def _matches(scheme: str, session_id: str, acl_id: str) -> bool:
    if scheme == "ip":
        try:
            address = ipaddress.ip_address(session_id)
            return address in ipaddress.ip_network(acl_id, strict=False)
        except ValueError:
            return False
    if scheme == "digest" and acl_id.endswith(":x") and acl_id.count(":") == 1:
        # Redacted (we lack ADMIN): the user name is all we can compare; the server decides the rest.
        return session_id.split(":", 1)[0] == acl_id[:-2]
    return session_id == acl_id


def allows(acl: Iterable[AclEntry], identity: Identity, permission: int) -> bool:
    entries = list(acl)
    if not entries or identity.is_super:
        return True
    for perms, scheme, acl_id in entries:
        if not perms & permission:
            continue
        if scheme == "world" and acl_id == "anyone":
            return True
        if any(s == scheme and _matches(scheme, i, acl_id) for s, i in identity.ids):
            return True
    return False


@dataclass(frozen=True)
class Missing:
    path: str
    permission: int
    why: str

    def message(self, identity: Identity) -> str:
        return (f"no {PERMISSION_NAMES[self.permission]} permission on znode {self.path} (ZooKeeper NoAuth) for this "
                f"sweeper's identity ({identity.describe()}): {self.why}")


def missing_permissions(needs: Mapping[str, tuple[int, str]], acls: Mapping[str, Acl],
                        identity: Identity) -> list[Missing]:
    """What `needs` (path -> (permission bits, why)) lacks, given each path's ACL (see `Acl`)."""
    out = []
    for path, (permission, why) in sorted(needs.items()):
        acl = acls.get(path)
        if acl is None:
            continue
        if isinstance(acl, str):  # UNREADABLE
            if permission & READ and not identity.is_super:
                out.append(Missing(path, READ, why))
            continue
        for bit in (READ, WRITE, CREATE, DELETE, ADMIN):
            if permission & bit and not allows(acl, identity, bit):
                out.append(Missing(path, bit, why))
    return out
