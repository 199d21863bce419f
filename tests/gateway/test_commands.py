"""`prismserve serve` and the client commands (register, unregister, list, invoke) against a live gateway."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_apps import ANSWER, TOKEN, chat_body, png, wait_for_health
from tiers import uses
from toy import APP_PATH
from toy.executors import EXECUTORS

from prismserve.cli import main
from prismserve.runtime import LocalRuntime
from prismserve.serve.launch import ServeOptions, prepare_server, run_server

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.fixture
def cli(gateway, monkeypatch, capsys):
    """Run `prismserve ARGS…` in-process against the gateway; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("PRISMSERVE_ADMIN_TOKEN", TOKEN)

    def run(*args: str) -> tuple[int, str, str]:
        code = main([args[0], "--url", str(gateway.base_url).rstrip("/"), *args[1:]])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_register_list_invoke_unregister(cli, tmp_path):
    app_file = tmp_path / "echo.py"
    app_file.write_text(ANSWER)
    code, out, _ = cli("register", str(app_file))
    assert code == 0 and json.loads(out)["name"] == "echo"
    code, out, _ = cli("list")
    assert code == 0 and [a["name"] for a in json.loads(out)["apps"]] == ["omni", "answer", "embed", "echo"]
    code, out, _ = cli("invoke", "echo", json.dumps(chat_body("via the command")))
    assert code == 0 and json.loads(out)["text"] == "[0 media, 0.000] user: via the command"
    code, out, _ = cli("unregister", "echo")
    assert code == 0 and json.loads(out) == {"unregistered": "echo"}


def test_invoke_prints_each_streamed_chunk_from_a_request_file(cli, tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(chat_body("one two")))
    code, out, _ = cli("invoke", "omni", f"@{request}")
    assert code == 0
    assert [json.loads(line)["text"] for line in out.splitlines()] == [
        "[0 media, 0.000]",
        " user:",
        " one",
        " two",
    ]


@pytest.mark.parametrize("replan", [True, False])
def test_serve_with_gpus_plans_at_start_and_watches_the_traffic_unless_told_not_to(
    replan, tmp_path, monkeypatch
):
    from toy.executors import VALUES

    from prismserve.runtime.pool import InProcessPool
    from prismserve.runtime.ray_runtime import RayRuntime

    monkeypatch.setenv("PRISMSERVE_PROFILE_CACHE", str(tmp_path))
    monkeypatch.setenv("PRISMSERVE_ADMIN_TOKEN", "t")
    runtime = RayRuntime(values=VALUES, pool=InProcessPool({"a": 6}))
    options = ServeOptions(str(APP_PATH), name="omni", gpus=6, replan=replan, port=0)
    server = prepare_server(options, runtime=runtime)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(asyncio.run(server.serve())))
    thread.start()
    try:
        wait_for_health(server.url, timeout=120)
        plan = httpx.get(f"{server.url}/admin/apps/omni/plan", headers={"Authorization": "Bearer t"})
        assert plan.status_code == 200 and plan.json()["options"]
        watched = server.controls.replanners
        assert list(watched) == (["omni"] if replan else [])
    finally:
        server.stop()
        thread.join(60)
    assert codes == [0]


@pytest.mark.parametrize(
    "args, message",
    [
        (("invoke", "nope", "{}"), "error: 404: no app named 'nope'"),
        (("invoke", "answer", "{oops"), "error: 400: malformed JSON"),
        (("invoke", "answer", "@/no/such/file.json"), "error: /no/such/file.json: No such file or directory"),
        (
            ("invoke", "omni", json.dumps(chat_body("fail midway"))),
            "(LLMTask) failed; the gateway's log has the details",
        ),
        (("register", "/no/such/app.py"), "error: /no/such/app.py: No such file or directory"),
        (("unregister", "nope"), "error: 404: no app named 'nope'"),
        (("list", "--token", "wrong"), "error: 401: admin API: missing or wrong bearer token"),
    ],
)
def test_client_errors_are_one_line_on_stderr_with_a_nonzero_exit(cli, args, message):
    code, _, err = cli(*args)
    assert code == 1
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")


def test_an_unreachable_gateway_is_reported(capsys):
    code = main(["list", "--url", "http://127.0.0.1:9", "--token", "t"])
    assert code == 1
    assert capsys.readouterr().err.startswith("error: cannot reach the gateway at http://127.0.0.1:9: ")


class _RecordingRuntime(LocalRuntime):
    """A LocalRuntime that remembers being started and closed."""

    events: list[str]

    async def start(self) -> None:
        self.events.append("start")

    async def close(self) -> None:
        self.events.append("close")


def test_serve_registers_the_app_applies_the_plan_prints_the_token_and_closes_the_runtime(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PRISMSERVE_ADMIN_TOKEN", "")  # empty: a token is generated
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"cells": [{"gpus": 1, "replicas": {"omni.thinker.llm": 1}}]}))
    runtime = _RecordingRuntime(EXECUTORS)
    runtime.events = []
    server = prepare_server(
        ServeOptions(str(APP_PATH), name="omni", plan_path=str(plan), port=0), runtime=runtime
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(asyncio.run(server.serve())))
    thread.start()
    try:
        wait_for_health(server.url)
        out = capsys.readouterr().out
        assert f"prismserve: serving app 'omni' at {server.url}\n" in out
        assert f"admin token (shown once; set PRISMSERVE_ADMIN_TOKEN to choose it): {server.token}\n" in out
        headers = {"Authorization": f"Bearer {server.token}"}
        assert [a["name"] for a in httpx.get(f"{server.url}/admin/apps", headers=headers).json()["apps"]] == [
            "omni"
        ]
        assert runtime.plans["omni"].replicas() == {"omni.thinker.llm": 1}
    finally:
        server.stop()
        thread.join(30)
    assert codes == [0] and runtime.events == ["start", "close"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["/no/such/app.py"], "error: /no/such/app.py: cannot read app file"),
        ([str(APP_PATH), "--plan", "/no/such/plan.json"], "error: /no/such/plan.json: cannot read plan"),
        (
            [str(APP_PATH), "--in-process", "--fake-gpus", "2"],
            "error: --in-process runs everything in this process",
        ),
        (
            [str(APP_PATH), "--routing", "static", "--host", "256.0.0.1"],
            "error: cannot listen on 256.0.0.1:8000",
        ),
        (
            [str(APP_PATH), "--in-process", "--record-trace", "/no/such/dir/trace.jsonl"],
            "error: --record-trace /no/such/dir/trace.jsonl: cannot append to it: No such file or directory",
        ),
    ],
)
def test_serve_reports_what_keeps_it_from_starting_in_one_line(args, message, capsys):
    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_serve_reports_a_plan_the_app_cannot_take_and_closes_the_runtime(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"cells": [{"gpus": 1, "replicas": {"omni.nothing": 1}}]}))
    runtime = _RecordingRuntime(EXECUTORS)
    runtime.events = []
    assert (
        run_server(ServeOptions(str(APP_PATH), name="omni", plan_path=str(plan), port=0), runtime=runtime)
        == 2
    )
    captured = capsys.readouterr()
    assert captured.err.startswith(
        "error: plan names deployments ['omni.nothing'] that app 'omni' does not have"
    )
    assert captured.out == "" and runtime.events == ["start", "close"]


def test_serve_reports_a_busy_port(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = run_server(ServeOptions(str(APP_PATH), port=port, in_process=True))
    assert code == 2
    assert capsys.readouterr().err.startswith(
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


@uses("serve")
@contextlib.contextmanager
def serving(
    *args: str, deadline: float = 180, **settings: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`python -m prismserve serve ARGS… --port 0` in a subprocess: (the process, its URL) once /health
    answers; `settings` are more environment variables. A server that has not announced itself
    within `deadline` seconds is killed."""
    command = [sys.executable, "-m", "prismserve", "serve", *args, "--port", "0"]
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
        "PRISMSERVE_ADMIN_TOKEN": "chosen-token",
        **settings,
    }
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(deadline, process.kill)
    watchdog.start()
    try:
        first = process.stdout.readline()  # printed once the app is registered
        watchdog.cancel()
        assert first.startswith("prismserve: serving app "), process.stderr.read()
        url = first.rsplit(" ", 1)[1].strip()
        wait_for_health(url)
        yield process, url
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()


def stopped(process: subprocess.Popen[str], stop: signal.Signals, deadline: float = 60) -> tuple[str, str]:
    """Send `stop` and wait (at most `deadline` seconds) for the process to exit: its stdout and stderr."""
    process.send_signal(stop)
    return process.communicate(timeout=deadline)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_in_process_runs_the_apps_real_executors_and_exits_cleanly_when_stopped(stop):
    """A tiny Qwen2.5-VL (image encoder fissioned from the transformers LLM) served without Ray."""
    from prismserve.models import tiny

    model = str(tiny.build("qwen2.5-vl"))
    image = "data:image/png;base64," + base64.b64encode(png((56, 56))).decode()
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is this?"}]
    body = {"model": "qwen2_5_vl", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    with serving(str(EXAMPLES / "qwen2_5_vl.py"), "--in-process", PRISMSERVE_MODEL=model) as (process, url):
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]  # random weights: some text
        out, err = stopped(process, stop)
    assert process.returncode == 0, err
    assert (
        out == "prismserve: stopped\n" and "Traceback" not in err
    )  # a token from the environment is not printed


def test_serve_in_process_rejects_a_task_without_a_real_executor(capsys):
    assert run_server(ServeOptions(str(APP_PATH), in_process=True, port=0)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: app 'omni_app': ") and err.count("\n") == 1
    assert "names no executor (executor_ref) and no executor function is registered" in err
    assert "so it cannot run in this process: serve it without --in-process" in err


def test_serve_on_ray_exits_0_after_a_clean_stop_by_sigterm(ray_cluster):
    """`ray.init` replaces the SIGTERM handler with one that exits with status 15 at once (joining a
    cluster as starting one)."""
    with serving(str(APP_PATH), "--address", ray_cluster.address) as (process, url):
        answer = httpx.post(f"{url}/v1/apps/omni_app/invoke", json=chat_body("hi"), timeout=60)
        assert answer.status_code == 200 and "[DONE]" in answer.text
        out, err = stopped(process, signal.SIGTERM)
    assert process.returncode == 0, err
    assert out == "prismserve: stopped\n"
