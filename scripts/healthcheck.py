"""The web container's healthcheck: GET /healthz from inside the container, as the proxy would.

It sends a host the app answers (the first of ALLOWED_HOSTS) and says the request came over
HTTPS (X-Forwarded-Proto, trusted with BEHIND_PROXY), so neither the host check nor the HTTPS
redirect turns it away. Exits 0 when the app and its database answer.
"""

import os
import sys
import urllib.request


def main() -> int:
    hosts = [host.strip().lstrip(".") for host in os.environ.get("ALLOWED_HOSTS", "").split(",")]
    host = next((host for host in hosts if host and host != "*"), "localhost")
    port = os.environ.get("PORT", "8000")
    request = urllib.request.Request(  # noqa: S310 - a fixed http URL to this container
        f"http://127.0.0.1:{port}/healthz", headers={"Host": host, "X-Forwarded-Proto": "https"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - see above
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
