"""Relay runtime: what every service process shares and nothing domain-specific.

Settings loading, JSON logs, readiness and probe routes, and the serving loop with graceful
shutdown. No Kafka, no Redis: those live in `relay_bus` and in the services.
"""
