"""The web, kept apart: the egress relay, search providers and page reading the research helper uses."""
