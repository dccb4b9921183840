"""The metadata store Pulsar and BookKeeper keep their metadata in: ZooKeeper or Oxia (issue 24).

Both are reached through one interface, the subset of kazoo's client the stages use (`get`, `get_children`,
`exists`, `create`, `delete` with a version, their `_async` forms, `transaction`), returning kazoo's shapes
(`ZnodeStat`, `NoNodeError`, `BadVersionError`), so every rule written and tested against ZooKeeper applies
unchanged: a kazoo client is the ZooKeeper implementation, `oxia.OxiaStore` the Oxia one. What differs is
declared, not hidden (`capabilities`): Oxia has no multi-key transaction and no ACLs.

- `urls`: the addresses in Pulsar's and BookKeeper's spellings;
- `oxia_keys`: what an Oxia server does with a key (its shard, its order, a directory's key range), used alike by
  the store and the read client;
- `oxia_client_fix`: the PyPI `oxia` client mended once per process (the server's key routing, a race-free start);
- `oxia`: the Oxia implementation over that client, and its bulk reader over `oxia_grpc`, our gRPC read client;
- `oxia_split`: BookKeeper's records in one Oxia namespace and Pulsar's in another, as one store and one reader;
- `migration`: PIP-454's ZooKeeper-to-Oxia migration flag, and what the sweeper refuses while it is set.
"""
