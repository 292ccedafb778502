"""Relay's Kafka bus: topic names, versioned message schemas, typed producer and consumers.

`relay_bus.clients` is the only module in the code base that imports a Kafka client library.
"""
