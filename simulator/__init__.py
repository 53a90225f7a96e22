"""Seeded, repeatable transaction simulator, shared by training, the load generator and tests."""
