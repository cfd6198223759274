"""A local HTTP server that speaks the /rerank protocol (Cohere, Jina, vLLM, Infinity, and TEI's
shape with `tei=True`), so tests run the real reranker client over HTTP.

It scores each document with `score(query, document)` (by default, how many of the query's words
it contains), records every request and can fail the next N requests with a status code.
"""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORD = re.compile(r"\w+")


def overlap(query: str, document: str) -> float:
    words = set(WORD.findall(query.lower()))
    return float(len(words & set(WORD.findall(document.lower()))))


class RerankDouble:
    def __init__(self, *, tei: bool = False, score=overlap):
        self.tei = tei
        self.score = score
        self.requests: list[tuple[dict, dict]] = []
        self.failures: list[int] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                double.requests.append((body, dict(self.headers)))
                if self.path != "/rerank":
                    return self._send(404, {"error": f"no route {self.path}"})
                if double.failures:
                    return self._send(double.failures.pop(0), {"error": "reranker is down"})
                documents = body["texts"] if double.tei else body["documents"]
                scores = [double.score(body["query"], document) for document in documents]
                ranked = sorted(range(len(documents)), key=lambda index: -scores[index])
                if double.tei:
                    return self._send(200, [{"index": index, "score": scores[index]} for index in ranked])
                return self._send(
                    200,
                    {"results": [{"index": index, "relevance_score": scores[index]} for index in ranked]},
                )

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "RerankDouble":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail(self, times: int, *, status: int = 500) -> None:
        self.failures += [status] * times
