"""Relay's topic rules (API.md, Topics), pure: no I/O, no framework, no storage engine.

- `relay_topics.rules`: topic names and filters, parsed into levels or refused with
  `TopicError`, and matched;
- `relay_topics.pages`: the order retained pages come in, and one page merged from the pages of
  several owners (keyset cursors);
- `relay_topics.index`: `FilterIndex`, which subscribers' filters match a topic, per partition.

The ingress, delivery, the retainer, `relay_routes` and the stream store all take the rules from
here, so there is one definition of each.
"""
