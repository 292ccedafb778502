"""relayctl: start, inspect and drive a Relay suite."""
