"""Relay archive: the Kafka log as Parquet files, and the replay of state from them."""
