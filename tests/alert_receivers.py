"""Real receivers of alerts on loopback: an HTTP server (webhook and PagerDuty Events API v2 shapes)
and an SMTP server with STARTTLS (aiosmtpd), each keeping what it received."""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Received:
    path: str
    body: dict
    headers: dict


@dataclass
class AlertReceiver:
    """POSTs to ``/hook`` (webhook) and ``/v2/enqueue`` (PagerDuty); ``mode``: ok, error (500) or hang."""

    mode: str = "ok"
    received: list[Received] = field(default_factory=list)
    refused: int = 0
    in_flight: int = 0   # requests being held (mode "hang")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> AlertReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if receiver.mode == "hang":
                    with receiver._lock:
                        receiver.in_flight += 1
                    time.sleep(3)
                    with receiver._lock:
                        receiver.in_flight -= 1
                if receiver.mode != "ok":
                    with receiver._lock:
                        receiver.refused += 1
                    self.send_response(500)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.received.append(Received(self.path, body, dict(self.headers)))
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"status": "success"}')

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hooks(self) -> list[dict]:
        with self._lock:
            return [r.body for r in self.received if r.path == "/hook"]

    def pagerduty(self) -> list[dict]:
        with self._lock:
            return [r.body for r in self.received if r.path == "/v2/enqueue"]

    def wait(self, count: int, what: str = "hooks", timeout: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = getattr(self, what)()
            if len(found) >= count:
                return found
            time.sleep(0.05)
        return getattr(self, what)()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost and its key (also the CA file the client trusts)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "smtp.pem", folder / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class MailReceiver:
    """aiosmtpd on 127.0.0.1 that requires STARTTLS before accepting mail; ``messages`` keeps them."""

    def __init__(self, folder: Path):
        self.cert, self.key = self_signed(folder)
        self.messages: list = []
        self.tls_sessions = 0

    def __enter__(self) -> MailReceiver:
        from aiosmtpd.controller import Controller

        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                from email import message_from_bytes

                receiver.messages.append(message_from_bytes(envelope.content))
                receiver.tls_sessions += 1 if session.ssl is not None else 0
                return "250 OK"

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, tls_context=context,
                                      require_starttls=True)
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()

    def wait(self, count: int, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.messages) < count:
            time.sleep(0.05)
        return list(self.messages)
