"""ZooKeeper access, one concern per module; nothing is re-exported here, so each import names its module:

- `client`: kazoo sessions with clear errors, pipelined reads (`connect`, `get_many`, `children_many`);
- `wire`: the wire-protocol bulk reader (multiRead, TLS, SASL) the snapshot and the delete verify with;
- `security`: TLS, SASL and digest settings per store, the same for both clients;
- `acl`: ACL rules (may this identity read or delete that znode?);
- `errors`: how access fails (refusals, exit 3). Both clients share it, so neither imports the other for it;
  what a read returns (`ZnodeRead`, `ChildrenRead`) is `sweeper.records`', shared with Oxia's reader.
"""
