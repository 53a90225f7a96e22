"""Training and export of the shipped model (not part of the service image)."""
