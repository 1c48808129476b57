"""Realtime model adapters: the only place in voice/ that imports a vendor SDK."""
