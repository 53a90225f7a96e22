"""Benchmarks of the service and its parts (`make bench`, `python -m bench.<module>`): tools on
top of the service packages, which never import them (tests/unit/test_layers.py)."""
