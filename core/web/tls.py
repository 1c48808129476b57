"""One TLS context for every HTTP client Pepper makes.

Building an ``ssl.SSLContext`` loads the whole CA bundle, which costs 15-60 ms of CPU on the
machines we run on; httpx builds a new one for each ``AsyncClient``. Pepper makes short-lived
clients on purpose (a connector call, a relayed fetch: each its own pool and redirect policy), so
the context is built once and shared: ``SSLContext`` is made to be shared by many connections, and
it is configured before first use and never changed after.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's own default context (certifi's CAs, ``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured), built once."""
    return httpx.create_ssl_context()
