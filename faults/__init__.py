"""Fault injection: scenarios against a real broker, each checked by a verifier."""
