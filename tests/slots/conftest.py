"""The slot tests' fixtures: the loopback plugin (``plugin_support``)."""

from plugin_support import loopback, plugin

__all__ = ["loopback", "plugin"]
