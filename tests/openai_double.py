"""A local HTTP server that speaks the OpenAI protocol, so tests run the real `openai` client.

It answers POST /v1/chat/completions (plain, and `stream: true` as server-sent events with a
final usage chunk) and POST /v1/embeddings (float or base64), from scripted handlers. It
records every request, can fail the next N requests with a status code, and can stream slowly.

    double.reply(lambda body: "answer")         # or double.reply("answer")
    double.fail(2, status=429)                  # the next two chat requests get 429
    double.chat_requests()                      # what the client sent
    double.api_key = "sk-..."                   # refuse any other key with 401, as OpenAI does
    double.ollama_version = "0.6.2"             # also answer Ollama's GET /api/version and /api/tags

GET /v1/models lists `double.served` (OpenAI's shape); `double.root_url` is the server without /v1,
where an Ollama client looks.
"""

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
MODELS_PATH = "/v1/models"


@dataclass
class RecordedRequest:
    path: str
    body: dict
    headers: dict = field(default_factory=dict)

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", [])

    @property
    def last_user_message(self) -> str:
        users = [message["content"] for message in self.messages if message.get("role") == "user"]
        return users[-1] if users else ""


@dataclass
class _Failure:
    path: str
    status: int
    message: str
    headers: dict


def deterministic_vector(text: str, dim: int) -> list[float]:
    """A unit vector that depends only on the text: same text, same vector."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return (vector / np.linalg.norm(vector)).tolist()


def _ollama_tag(name: str) -> dict:
    """One model as Ollama's /api/tags lists it (the `ollama` client reads `model`; older servers sent `name`)."""
    digest = hashlib.sha256(name.encode()).hexdigest()
    return {
        "name": name,
        "model": name,
        "modified_at": "2026-01-01T00:00:00Z",
        "size": 1000,
        "digest": digest,
        "details": {"format": "gguf", "family": "double", "parameter_size": "1B", "quantization_level": "Q4_0"},
    }


def _words(text: str) -> int:
    return max(1, len(text.split()))


class OpenAIDouble:
    def __init__(self, *, dim: int = 384, model: str = "double-model"):
        self.dim = dim
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.chat_handler: Callable[[dict], str] = lambda body: "OK"
        self.embedding_handler: Callable[[str], list[float]] = lambda text: deterministic_vector(text, self.dim)
        self.token_delay = 0.0
        # Set to an Event to hold a streamed answer before its last token until the event is set:
        # whatever the client received by then was streamed, not buffered.
        self.hold_last_token: threading.Event | None = None
        self.report_usage = True
        self.streams_closed_early = 0
        self.api_key: str | None = None
        self.served = ["double-chat", "double-embed"]
        self.ollama_version: str | None = None
        self._failures: list[_Failure] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # Scripting -----------------------------------------------------------------------

    def reply(self, answer: str | Callable[[dict], str]) -> None:
        self.chat_handler = answer if callable(answer) else (lambda body: answer)

    def fail(self, times: int, *, status: int = 500, path: str = CHAT_PATH, message: str = "", headers=None) -> None:
        """Make the next `times` requests to `path` fail with `status`."""
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(path, status, message or f"scripted failure {status}", headers or {}))

    def requests_to(self, path: str) -> list[RecordedRequest]:
        with self._lock:
            return [request for request in self.requests if request.path == path]

    def chat_requests(self) -> list[RecordedRequest]:
        return self.requests_to(CHAT_PATH)

    def embedding_requests(self) -> list[RecordedRequest]:
        return self.requests_to(EMBEDDINGS_PATH)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    # Lifecycle -----------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        assert self._server is not None, "start() the double first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def start(self) -> "OpenAIDouble":
        double = self

        class Handler(_Handler):
            owner = double

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="openai-double", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # Used by the handler -------------------------------------------------------------

    def _record(self, path: str, body: dict, headers: dict) -> _Failure | None:
        with self._lock:
            self.requests.append(RecordedRequest(path, body, headers))
            for index, failure in enumerate(self._failures):
                if failure.path == path:
                    return self._failures.pop(index)
        return None


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIDouble
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as real API servers set it. Without it the body, written after the headers,
    # waits for the client's delayed ACK: every reply took ~45 ms instead of ~4, and a streamed
    # answer's first token came that much later.
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

    def _refused_key(self) -> bool:
        """OpenAI's 401, quoting the key it refused (so tests see that we mask it)."""
        expected = self.owner.api_key
        given = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if expected is None or given == expected:
            return False
        self._json(
            401,
            {
                "error": {
                    "message": f"Incorrect API key provided: {given}. You can find your API key at the dashboard.",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        )
        return True

    def do_GET(self):
        self.owner._record(self.path, {}, dict(self.headers))
        if self.owner.ollama_version is not None and self.path == "/api/version":
            return self._json(200, {"version": self.owner.ollama_version})
        if self.owner.ollama_version is not None and self.path == "/api/tags":
            return self._json(200, {"models": [_ollama_tag(name) for name in self.owner.served]})
        if self.path == MODELS_PATH:
            if self._refused_key():
                return None
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "double"} for name in self.owner.served]
            return self._json(200, {"object": "list", "data": data})
        return self._json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            return self._json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
        failure = self.owner._record(self.path, body, dict(self.headers))
        if self._refused_key():
            return None
        if failure is not None:
            return self._json(
                failure.status,
                {"error": {"message": failure.message, "type": "server_error", "code": None}},
                failure.headers,
            )
        if self.path == CHAT_PATH:
            return self._chat(body)
        if self.path == EMBEDDINGS_PATH:
            return self._embeddings(body)
        return self._json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def _json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _chat(self, body: dict) -> None:
        try:
            text = self.owner.chat_handler(body)
        except Exception as exc:  # a handler bug shows up as a 500 the test can see
            return self._json(500, {"error": {"message": f"handler raised {exc!r}", "type": "server_error"}})
        prompt_tokens = sum(_words(str(message.get("content") or "")) for message in body.get("messages", []))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": _words(text),
            "total_tokens": prompt_tokens + _words(text),
        }
        if body.get("stream"):
            return self._stream(body, text, usage)
        payload = {
            "id": "chatcmpl-double",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.owner.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
        if self.owner.report_usage:
            payload["usage"] = usage
        return self._json(200, payload)

    def _stream(self, body: dict, text: str, usage: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        model = body.get("model", self.owner.model)

        def event(choices, **extra) -> bytes:
            chunk = {
                "id": "chatcmpl-double",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(chunk)}\n\n".encode()

        try:
            self.wfile.write(event([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]))
            tokens = re.findall(r"\S+\s*|\s+", text)
            for index, token in enumerate(tokens):
                if self.owner.hold_last_token is not None and index == len(tokens) - 1:
                    self.owner.hold_last_token.wait(timeout=60)
                if self.owner.token_delay:
                    time.sleep(self.owner.token_delay)
                self.wfile.write(event([{"index": 0, "delta": {"content": token}, "finish_reason": None}]))
                self.wfile.flush()
            self.wfile.write(event([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
            if self.owner.report_usage and (body.get("stream_options") or {}).get("include_usage"):
                self.wfile.write(event([], usage=usage))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            with self.owner._lock:
                self.owner.streams_closed_early += 1

    def _embeddings(self, body: dict) -> None:
        texts = body.get("input", [])
        if isinstance(texts, str):
            texts = [texts]
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = self.owner.embedding_handler(text)
            if as_base64:
                vector = base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(_words(text) for text in texts)
        return self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", self.owner.model),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )
