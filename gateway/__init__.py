"""The HTTP and WebSocket edge, the server's start-up wiring and the ``pepper`` CLI."""
