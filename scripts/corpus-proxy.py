#!/usr/bin/env python3
"""A recording HTTP proxy between a fleet-node and its controller, for scripts/record-corpus.sh.

Every node-protocol request is forwarded as it is; the report a node sends (`PUT observed`, the
body of `POST exchange`) and every desired state the controller answers (`200` of `GET desired`
or `POST exchange`) are written to the output directory, one JSON file each, numbered in order:
`report-0001.json`, `desired-0002.json`. Held long-polls are held here too (one thread per
request). Stops on SIGTERM.

usage: corpus-proxy.py LISTEN_PORT UPSTREAM_URL OUT_DIR
"""

import http.client
import http.server
import itertools
import os
import signal
import sys
import threading
import urllib.parse

PORT, UPSTREAM, OUT = int(sys.argv[1]), urllib.parse.urlsplit(sys.argv[2]), sys.argv[3]
COUNTER = itertools.count(1)
LOCK = threading.Lock()
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def record(kind, body):
    """Writes one message as `<kind>-<n>.json`."""
    if not body:
        return
    with LOCK:
        n = next(COUNTER)
    with open(os.path.join(OUT, f"{kind}-{n:04d}.json"), "wb") as f:
        f.write(body)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forward(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urllib.parse.urlsplit(self.path).path
        if path in ("/api/v1/nodes/me/observed", "/api/v1/nodes/me/exchange"):
            record("report", body)
        up = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        up.request(self.command, self.path, body=body or None, headers=headers)
        resp = up.getresponse()
        answer = resp.read()
        if resp.status == 200 and path in ("/api/v1/nodes/me/desired", "/api/v1/nodes/me/exchange"):
            record("desired", answer)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        up.close()

    do_GET = do_PUT = do_POST = do_DELETE = forward


def main():
    os.makedirs(OUT, exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    main()
