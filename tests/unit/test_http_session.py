"""LeanSession sends the bytes ``requests.Session`` would send, and falls back to it whenever
there is something to merge (proxies, cookies, auth, redirects to follow).

A real HTTP server on a loopback port records each request as it arrives on the socket.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from bus.adapters.azure.http import LeanSession


class _Recorder:
    """Accepts connections and answers every request with 200 and a small body, keeping the
    raw bytes of each request (headers and body)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-ms-test: yes\r\n\r\nok")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[_Recorder]:
    recorder = _Recorder()
    yield recorder
    recorder.close()


def _session(cls: type[requests.Session]) -> requests.Session:
    session = cls()
    session.trust_env = False  # as the Azure adapter builds it
    return session


CASES: list[tuple[str, str, dict[str, str], Any]] = [
    ("GET", "/devstoreaccount1/t(PartitionKey='p%20q',RowKey='r')?$format=json",
     {"x-ms-version": "2019-02-02", "Accept": "application/json;odata=minimalmetadata"}, None),
    ("GET", "/t()?$filter=PartitionKey eq 'a b' and ( RowKey eq 'ü' )", {"Accept": "*/*"},
     None),
    ("PUT", "/q/messages?visibilitytimeout=5", {"Content-Type": "application/xml"},
     b"<QueueMessage><MessageText>aGk=</MessageText></QueueMessage>"),
    ("POST", "/$batch", {"Content-Type": "multipart/mixed; boundary=b"}, "--b\r\nbody\r\n--b--"),
    ("DELETE", "/q/messages/1?popreceipt=a%2Fb", {"If-Match": "*"}, None),
    ("HEAD", "/c/blob", {}, None),
]


@pytest.mark.parametrize(("method", "path", "headers", "data"), CASES)
def test_the_same_bytes_as_requests(server: _Recorder, method: str, path: str,
                                    headers: dict[str, str], data: Any) -> None:
    sent = []
    for cls in (requests.Session, LeanSession):
        with _session(cls) as session:
            response = session.request(method, server.url + path, headers=headers, data=data,
                                       timeout=(5, 5), allow_redirects=False, verify=True,
                                       cert=None, proxies=None, files=None)
            assert response.status_code == 200
            assert response.headers["x-ms-test"] == "yes"
            assert response.content == (b"" if method == "HEAD" else b"ok")
        sent.append(server.requests[-1])
    assert sent[0] == sent[1]


def test_a_streamed_response_is_left_unread(server: _Recorder) -> None:
    with _session(LeanSession) as session:
        response = session.request("GET", server.url + "/c/blob", stream=True, timeout=5,
                                   allow_redirects=False)
        assert not response._content_consumed  # what stream=True promises
        assert b"".join(response.iter_content(1)) == b"ok"


@pytest.mark.parametrize("setting", ["proxies", "cookies", "redirects", "trust_env", "auth"])
def test_anything_to_merge_takes_the_requests_path(server: _Recorder, setting: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    session = _session(LeanSession)
    kwargs: dict[str, Any] = {"allow_redirects": False}
    if setting == "proxies":
        session.proxies = {"no": "proxy-for-this-scheme"}
    elif setting == "cookies":
        session.cookies.set("c", "v")
    elif setting == "redirects":
        kwargs["allow_redirects"] = True
    elif setting == "trust_env":
        session.trust_env = True
    else:
        kwargs["auth"] = ("user", "password")
    calls: list[str] = []
    stock = requests.Session.request

    def spy(self: requests.Session, *args: Any, **kw: Any) -> requests.Response:
        calls.append(setting)
        return stock(self, *args, **kw)

    monkeypatch.setattr(requests.Session, "request", spy)
    with session:
        assert session.request("GET", server.url + "/x", timeout=5, **kwargs).status_code == 200
    assert calls == [setting]
    if setting == "cookies":
        assert b"Cookie: c=v" in server.requests[-1]


def test_the_plain_call_takes_the_lean_path(server: _Recorder,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> requests.Response:
        raise AssertionError("Session.request was used")

    monkeypatch.setattr(requests.Session, "request", refuse)
    with _session(LeanSession) as session:
        assert session.request("GET", server.url + "/x", timeout=5,
                               allow_redirects=False).status_code == 200
