"""A local stand-in for the Hugging Face hub: the endpoints `huggingface_hub.snapshot_download` calls
(model info, the repo tree, `resolve` with the headers huggingface_hub 2.x reads), over a directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves `repos` (hub id -> checkpoint directory); ids in `gated` answer 401 as gated repos do."""

    def __init__(self, repos: dict[str, Path], gated: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.repos, self.gated = repos, gated
        self.requests: list[str] = []

    def files(self, repo: str) -> dict[str, Path]:
        root = self.repos[repo]
        return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}

    def answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        self.requests.append(f"{method} {path}")
        path = unquote(urlsplit(path).path)
        if path.startswith("/api/models/"):
            repo, _, rest = path[len("/api/models/") :].partition("/revision/")
            if not rest:
                repo, _, rest = path[len("/api/models/") :].partition("/tree/")
                return self._guarded(repo, lambda: self._tree(repo))
            return self._guarded(repo, lambda: self._info(repo))
        repo, _, rest = path.lstrip("/").partition("/resolve/")
        _, _, name = rest.partition("/")
        return self._guarded(repo, lambda: self._file(repo, name))

    def _guarded(self, repo: str, ok: object) -> tuple[int, dict[str, str], bytes]:
        if repo in self.gated:
            return (
                401,
                {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this model is restricted."},
                b"{}",
            )
        if repo not in self.repos:
            return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, b"{}"
        return ok()  # type: ignore[operator]

    def _info(self, repo: str) -> tuple[int, dict[str, str], bytes]:
        siblings = [{"rfilename": name} for name in self.files(repo)]
        body = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings}
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def _tree(self, repo: str) -> tuple[int, dict[str, str], bytes]:
        entries = [
            {"type": "file", "path": name, "size": p.stat().st_size, "oid": _oid(p)}
            for name, p in self.files(repo).items()
        ]
        return 200, {"Content-Type": "application/json"}, json.dumps(entries).encode()

    def _file(self, repo: str, name: str) -> tuple[int, dict[str, str], bytes]:
        files = self.files(repo)
        if name not in files:
            return 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}, b"{}"
        data = files[name].read_bytes()
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": f'"{_oid(files[name])}"',
            "Content-Length": str(len(data)),
        }
        return 200, headers, data


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def fake_hub(hub: FakeHub) -> Iterator[str]:
    """The hub served on 127.0.0.1 in a thread; yields its URL (for HF_ENDPOINT)."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, with_body: bool) -> None:
            status, headers, body = hub.answer(self.command, self.path)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._reply(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._reply(False)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
