"""Relay's queues (BRIEF §1, API.md Queues): the rules, apart from the services that carry them."""
