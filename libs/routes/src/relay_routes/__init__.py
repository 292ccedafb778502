"""Relay's routing state in Redis (BRIEF §3: ephemeral and rebuildable)."""
