"""An upload over the limit is refused from its Content-Length, before its body is read.

Django's ASGI handler reads a request's whole body before any middleware or view runs, so a
60 MB file was sent in full only to be refused. This ASGI wrapper, in front of Django
(config/asgi.py), answers a POST to the upload page whose declared length is over the upload limit
at once with 413, with the limit's own message (ingestion.check_upload_size); the browser stops
sending. The page's script sends one file per request, so the limit of a file is the limit of a
request (plus the form around it); the view checks each file's size again.
"""

import json

from django.urls import Resolver404, resolve

from knowledge.services import ingestion

# The multipart boundaries, headers and small fields around the file in one upload request.
FORM_OVERHEAD_BYTES = 64 * 1024
UPLOAD_URL_NAME = "knowledge:upload"


def oversized(scope) -> str | None:
    """The refusal of an upload request whose declared body is over the limit, else None."""
    if scope["method"] != "POST":
        return None
    headers = dict(scope["headers"])
    length = headers.get(b"content-length", b"").decode("latin-1")
    if not length.isdigit():
        return None
    try:
        if resolve(scope["path"]).view_name != UPLOAD_URL_NAME:
            return None
    except Resolver404:
        return None
    try:
        ingestion.check_upload_size("This upload", max(0, int(length) - FORM_OVERHEAD_BYTES))
    except ingestion.DocumentRejected as refused:
        return str(refused)
    return None


def refuse_oversized_uploads(app):
    async def gate(scope, receive, send):
        refusal = oversized(scope)
        if refusal is None:
            await app(scope, receive, send)
            return
        accept = dict(scope["headers"]).get(b"accept", b"")
        if b"application/json" in accept:
            body, content_type = json.dumps({"error": refusal}).encode(), b"application/json"
        else:
            body, content_type = refusal.encode(), b"text/plain; charset=utf-8"
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                # The rest of the body is not wanted: the connection ends with this answer.
                "headers": [(b"content-type", content_type), (b"connection", b"close")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return gate
