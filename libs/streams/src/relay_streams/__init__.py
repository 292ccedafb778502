"""Relay's durable stream store (seed 003): databases of shards of generations of streams,
learned from topics (LTS), replayed by iterators; persistent site ids and replica records.

Entry point: `relay_streams.store.StreamStore`. Topic rules: `relay_topics.rules`.
"""
