"""Feature areas. Each is its own package and never imports another area."""
