"""Adapters for vendor SDKs that belong to no one layer: each SDK is imported only inside its folder here."""
