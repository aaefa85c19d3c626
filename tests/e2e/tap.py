"""A recording pass-through between the client and loopwarden.

It shows what only the client side can show: the exact bytes the client sent (to compare
with what the mock received), the `x-loopwarden-*` headers the client got, and the reply
bodies. Responses are relayed read by read, so streams stay streams.
"""

import hashlib
import http.client
import socket
import struct
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
        # A WebSocket (Codex's Responses transport): the text frames the client sent, each
        # as it would be a request body; `response` holds the server's frames as they came.
        self.websocket = False
        self.frames = []

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
        if (h.headers.get("Upgrade") or "").lower() == "websocket":
            return self.tunnel(h)
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


    def tunnel(self, h):
        """A WebSocket upgrade: the head goes to loopwarden as it came, then the bytes both
        ways until either side closes. The client's frames are decoded for the checks."""
        ex = Exchange(h.command, h.path, b"")
        ex.websocket = True
        with self.lock:
            self.exchanges.append(ex)
        h.close_connection = True
        up = socket.create_connection(("127.0.0.1", self.upstream_port))
        head = f"{h.command} {h.path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in h.headers.items()) + "\r\n"
        up.sendall(head.encode("latin-1"))
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = up.recv(65536)
            if not piece:
                break
            answer += piece
        end = answer.find(b"\r\n\r\n") + 4
        lines = answer[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        ex.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        ex.headers = {k.strip().lower(): v.strip() for k, v in
                      (line.split(":", 1) for line in lines[1:] if ":" in line)}
        ex.response += answer[end:]
        client = h.connection
        client.sendall(answer)

        def to_upstream():
            frames = ClientFrames()
            try:
                while True:
                    piece = client.recv(65536)
                    if not piece:
                        break
                    ex.frames.extend(frames.feed(piece))
                    up.sendall(piece)
            except OSError:
                pass
            finally:
                try:
                    up.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        sender = threading.Thread(target=to_upstream, daemon=True)
        sender.start()
        try:
            while True:
                piece = up.recv(65536)
                if not piece:
                    break
                if len(ex.response) < KEEP_BODY:
                    ex.response += piece
                client.sendall(piece)
        except OSError as e:
            ex.error = f"tunnel: {e}"
        finally:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sender.join(5)
            up.close()


class ClientFrames:
    """Reads a client's WebSocket frames (masked) as they arrive: the text messages, as
    bytes, fragments joined, control frames skipped."""

    def __init__(self):
        self.buf = bytearray()
        self.partial = None

    def feed(self, piece):
        self.buf += piece
        texts = []
        buf = self.buf
        while len(buf) >= 2:
            fin, opcode = buf[0] & 0x80, buf[0] & 0x0F
            masked, n = buf[1] & 0x80, buf[1] & 0x7F
            at = 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, at = struct.unpack(">H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, at = struct.unpack(">Q", buf[2:10])[0], 10
            key = bytes(buf[at:at + 4]) if masked else b"\0\0\0\0"
            at += 4 if masked else 0
            if len(buf) < at + n:
                break
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(buf[at:at + n]))
            del buf[:at + n]
            if opcode == 0x1:
                self.partial = bytearray(payload)
            elif opcode == 0x0 and self.partial is not None:
                self.partial += payload
            else:
                continue
            if fin:
                texts.append(bytes(self.partial))
                self.partial = None
        return texts


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
