"""Request body limits by path.

The app's ``MAX_CONTENT_LENGTH`` suits Twilio's small forms; inbound mail arrives as one form with
its attachments, so its path may be larger. Quart fixes a request's body limit when it creates the
request, so the choice is made here rather than in the handler.
"""

from __future__ import annotations

from typing import Any

from quart import Request

from gateway.webhooks import EMAIL

# Mailgun accepts messages up to 25 MB; the form around them adds a little.
MAX_EMAIL_BYTES = 30 * 1024 * 1024

LARGER_BODIES: dict[str, int] = {EMAIL.path: MAX_EMAIL_BYTES}


class PathLimitedRequest(Request):
    """A request whose body limit is ``LARGER_BODIES[path]`` where set, else the app's."""

    def __init__(self, method: str, scheme: str, path: str, *args: Any, **kwargs: Any) -> None:
        larger = LARGER_BODIES.get(path)
        if larger is not None:
            kwargs["max_content_length"] = larger
        super().__init__(method, scheme, path, *args, **kwargs)
        if larger is not None:
            # The argument only bounds the body. The form parser reads the property, which otherwise
            # falls back to the app's small limit and refuses a body that arrived in one piece (as
            # it does when the handler runs late on a busy machine) even though it streams fine.
            self.max_content_length = larger
