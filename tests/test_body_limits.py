"""Body limits by path, with the real Quart request and form parser."""

from __future__ import annotations

import io

from quart import Quart, request
from werkzeug.datastructures import FileStorage

from gateway.limits import MAX_EMAIL_BYTES, PathLimitedRequest
from gateway.webhooks import EMAIL

SMALL = 256 * 1024


def _app() -> Quart:
    app = Quart(__name__)
    app.config["MAX_CONTENT_LENGTH"] = SMALL
    app.request_class = PathLimitedRequest

    async def sizes() -> dict[str, int]:
        request.max_form_memory_size = MAX_EMAIL_BYTES  # as the email webhook does
        form, files = await request.form, await request.files
        return {"text": len(form["text"]), "file": len(files["file"].read())}

    app.add_url_rule(EMAIL.path, "mail", sizes, methods=["POST"])
    app.add_url_rule("/sms", "sms", sizes, methods=["POST"])
    return app


def _upload(data: bytes) -> FileStorage:
    return FileStorage(io.BytesIO(data), filename="plans.pdf", content_type="application/pdf")


async def test_a_large_mail_that_arrives_in_one_piece_is_parsed():
    # The test client hands the whole body over at once, as a server does when the handler starts
    # after the last byte arrived: the parser then sees one chunk far above the app's small limit.
    client = _app().test_client()
    text, attachment = "k" * 700_000, b"%PDF" + b"0" * 1_000_000
    response = await client.post(EMAIL.path, form={"text": text}, files={"file": _upload(attachment)})
    assert response.status_code == 200, await response.get_data(as_text=True)
    assert await response.get_json() == {"text": len(text), "file": len(attachment)}


async def test_other_paths_keep_the_small_limit():
    client = _app().test_client()
    response = await client.post("/sms", form={"text": "k" * (SMALL + 1)}, files={"file": _upload(b"x")})
    assert response.status_code == 413
