"""The text harness test kit: fault suites that drive real turns against loopback peers."""
