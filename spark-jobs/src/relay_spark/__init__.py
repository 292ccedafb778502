"""Relay's PySpark jobs over the Kafka archive (`relay_archive`)."""
