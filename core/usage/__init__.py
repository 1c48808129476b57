"""Usage per person: ``core.usage.config`` (the settings) and ``core.usage.ledger`` (the sums, caps and tiers)."""
