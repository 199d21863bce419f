"""The client side of `prismserve register / unregister / list / invoke`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from prismserve.serve.launch import TOKEN_VARIABLE


class ClientError(Exception):
    """A request to the gateway failed; the message is the gateway's or the connection's."""


def run_client(args: argparse.Namespace) -> int:
    """Run one client command against the gateway at `args.url`; returns the exit code."""
    import httpx

    token = args.token or os.environ.get(TOKEN_VARIABLE, "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(
            base_url=args.url, headers=headers, timeout=httpx.Timeout(600, connect=5)
        ) as client:
            if args.command == "register":
                path = Path(args.app)
                try:
                    source = path.read_text()
                except OSError as exc:
                    raise ClientError(f"{path}: {exc.strerror or exc}") from None
                _print(
                    _check(
                        client.post("/admin/apps", json={"name": args.name or path.stem, "source": source})
                    )
                )
            elif args.command == "unregister":
                _print(_check(client.delete(f"/admin/apps/{args.name}")))
            elif args.command == "list":
                _print(_check(client.get("/admin/apps")))
            else:
                _invoke(client, args.name, _request_body(args.request))
    except httpx.HTTPError as exc:
        raise ClientError(f"cannot reach the gateway at {args.url}: {exc}") from None
    return 0


def _request_body(text: str) -> bytes:
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_bytes()
        except OSError as exc:
            raise ClientError(f"{text[1:]}: {exc.strerror or exc}") from None
    return text.encode()


def _invoke(client: Any, name: str, body: bytes) -> None:
    with client.stream(
        "POST", f"/v1/apps/{name}/invoke", content=body, headers={"content-type": "application/json"}
    ) as response:
        if response.status_code >= 400:
            response.read()
            _check(response)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            response.read()
            _print(response.json())
            return
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
                if event == "error":
                    raise ClientError(json.loads(data)["error"]["message"])
                if data != "[DONE]":
                    print(data, flush=True)
                event = None


def _check(response: Any) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"message": response.text}}
    if response.status_code >= 400:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise ClientError(f"{response.status_code}: {message or body}")
    return body


def _print(body: Any) -> None:
    json.dump(body, sys.stdout, indent=2)
    sys.stdout.write("\n")
