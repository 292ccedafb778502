"""The durable storage admin (`/ds`, EMQX's DS API) as rules and values, pure: no I/O, no
framework, no storage engine.

- `relay_ds.sites`: site ids and replica-set targets, parsed or refused;
- `relay_ds.info`: the `/ds` values (storages, shards, sites, `DsInfo`), one retainer's
  description of its share, and the text of `relayctl ds info`;
- `relay_ds.view`: every retainer's description merged into one view (with each storage's
  replicated target record when it has one), and the rules a replica-set or site change must
  pass against it;
- `relay_ds.targets`: a storage's replica-set target as the one record the replicators keep
  (namespace `$ds`), and which records a store must apply;
- `relay_ds.batches`: a durable-stream write checked against its limits and split by the
  partition that owns each topic;
- `relay_ds.tokens`: database names and the opaque stream and iterator strings clients hold;
- `relay_ds.errors`: what a refusal is (400, 404 or 413 in the API).

The stream store, the retainer, the ingress and relayctl all take these from here, so each value
has one shape and each rule one definition.
"""
