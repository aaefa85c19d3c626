"""A recording pass-through between the client and loopwarden.

It shows what only the client side can show: the exact bytes the client sent (to compare
with what the mock received), the `x-loopwarden-*` headers the client got, and the reply
bodies. Responses are relayed read by read, so streams stay streams.
"""

import hashlib
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade", "host", "content-length"}
KEEP_BODY = 4 << 20  # bytes of each response body kept for the checks


class Exchange:
    """One request and its response, as the client saw them."""

    def __init__(self, method, path, body):
        self.method = method
        self.path = path
        self.body = body
        self.sha256 = hashlib.sha256(body).hexdigest()
        self.status = None
        self.headers = {}
        self.response = bytearray()
        self.error = None

    @property
    def decision(self):
        return self.headers.get("x-loopwarden-decision")


class Tap:
    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.exchanges = []
        self.lock = threading.Lock()
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                tap.relay(self)

            do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def relay(self, h):
        body = read_body(h)
        ex = Exchange(h.command, h.path, body)
        with self.lock:
            self.exchanges.append(ex)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=600)
        try:
            upstream.request(h.command, h.path, body=body if body or h.command in ("POST", "PUT") else None,
                             headers=headers)
            resp = upstream.getresponse()
        except OSError as e:
            ex.error = f"upstream: {e}"
            h.send_error(502)
            return
        ex.status = resp.status
        ex.headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            h.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    h.send_header(k, v)
            no_body = h.command == "HEAD" or resp.status in (204, 304)
            if not no_body:
                h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            while not no_body:
                piece = resp.read1(65536)
                if not piece:
                    break
                if len(ex.response) < KEEP_BODY:
                    ex.response += piece
                h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                h.wfile.flush()
            if not no_body:
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()
        except (OSError, http.client.HTTPException) as e:
            ex.error = f"relay: {e}"
            h.close_connection = True
        finally:
            upstream.close()


def read_body(h):
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        data = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(data)
            data += h.rfile.read(size)
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n else b""
