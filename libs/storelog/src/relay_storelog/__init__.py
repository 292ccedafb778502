"""Relay's queue store log (seed 001): queue records in memory, persisted as an append-only log
with live dumps (`store.StoreLog`)."""
