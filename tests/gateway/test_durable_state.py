"""`serve --state FILE`: the apps registered and the plans posted through the admin API are kept in a
file as they change and restored by the next server with the same file; a file that cannot be read
stops the start with a message saying how to start afresh."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from gateway_apps import ADMIN, ANSWER, OMNI, TOKEN, chat_body, wait_for_health
from toy import APP_PATH
from toy.executors import EXECUTORS

from prismserve.control import Controls
from prismserve.gateway import create_gateway
from prismserve.gateway.durable import DurableState
from prismserve.planner import Plan
from prismserve.runtime import LocalRuntime
from prismserve.serve.launch import ServeOptions, StartupError, prepare_server

CHAT = {"model": "omni", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
PLAN = {"cells": [{"gpus": 2, "count": 2, "replicas": {"omni.thinker.llm": 1, "omni.talker": 1}}]}


def test_the_admin_apis_changes_are_kept_in_the_state_file(serve_gateway, tmp_path):
    path = tmp_path / "state.json"
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, durable=DurableState(path))
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for name, source in (("omni", OMNI), ("answer", ANSWER), ("gone", ANSWER)):
            assert client.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN).is_success
        assert client.post("/admin/apps/omni/plan", json=PLAN, headers=ADMIN).is_success
        assert client.delete("/admin/apps/gone", headers=ADMIN).is_success
        refused = {"cells": [{"gpus": 1, "replicas": {"omni.nothing": 1}}]}
        assert client.post("/admin/apps/answer/plan", json=refused, headers=ADMIN).status_code == 400
    kept = json.loads(path.read_text())
    assert kept["apps"] == {"omni": OMNI, "answer": ANSWER}  # the unregistered one is gone
    assert list(kept["plans"]) == ["omni"]  # a refused plan is not kept
    assert Plan.model_validate(kept["plans"]["omni"]) == Plan.model_validate(PLAN)


def test_a_new_server_restores_the_apps_and_plans_and_an_app_that_fails_only_itself(tmp_path):
    path = tmp_path / "state.json"
    before = DurableState(path)
    before.app_registered("omni", OMNI)
    before.app_registered("answer", ANSWER)
    before.app_registered("broken", "this is not python")
    before.plan_posted("omni", Plan.model_validate(PLAN))

    async def restart() -> tuple[list[str], LocalRuntime]:
        runtime = LocalRuntime(EXECUTORS)
        try:
            return await DurableState(path).restore(runtime, Controls(runtime)), runtime
        finally:
            await runtime.close()

    restored, runtime = asyncio.run(restart())
    assert restored == ["answer", "omni"]
    assert runtime.plans["omni"] == Plan.model_validate(PLAN)
    assert "broken" in DurableState(path).apps  # kept for the user to fix, not silently dropped


def test_a_state_file_that_cannot_be_read_stops_the_start(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(StartupError, match=r"--state: state file .* cannot be read: .*move it away"):
        prepare_server(ServeOptions(str(APP_PATH), state=str(path), port=0))


@pytest.mark.reliability
def test_a_restarted_server_serves_the_kept_apps_and_loses_no_request_it_took(tmp_path, monkeypatch):
    """Load runs through a restart of the server (same port, same state file): every request either
    completed or was refused at connect while no server listened — none that a server took failed —
    and the restarted server serves the app registered through the admin API, with its plan."""
    monkeypatch.setenv("PRISMSERVE_ADMIN_TOKEN", TOKEN)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = ServeOptions(str(APP_PATH), name="omni", port=port, state=str(tmp_path / "state.json"))
    url = f"http://127.0.0.1:{port}"
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                try:
                    answer = client.post(f"{url}/v1/chat/completions", json=CHAT)
                    outcomes.append("ok" if answer.status_code == 200 else f"status {answer.status_code}")
                except httpx.ConnectError:
                    outcomes.append("refused")
                    time.sleep(0.01)

    def serving(check) -> None:
        server = prepare_server(options, runtime=LocalRuntime(EXECUTORS))
        thread = threading.Thread(target=lambda: asyncio.run(server.serve()))
        thread.start()
        try:
            wait_for_health(url)
            check()
        finally:
            server.stop()
            thread.join(30)

    def register() -> None:
        added = httpx.post(f"{url}/admin/apps", json={"name": "answer", "source": ANSWER}, headers=ADMIN)
        assert added.status_code == 201, added.text
        assert httpx.post(f"{url}/admin/apps/omni/plan", json=PLAN, headers=ADMIN).is_success
        time.sleep(0.5)  # load on the first server

    def restored() -> None:
        listed = httpx.get(f"{url}/admin/apps", headers=ADMIN).json()["apps"]
        assert sorted(a["name"] for a in listed) == ["answer", "omni"]
        plan = httpx.get(f"{url}/admin/apps/omni/plan", headers=ADMIN).json()
        assert Plan.model_validate(plan) == Plan.model_validate(PLAN)
        answer = httpx.post(f"{url}/v1/apps/answer/invoke", json=chat_body("two words"), timeout=30)
        assert answer.status_code == 200, answer.text
        time.sleep(0.5)  # load on the restarted server

    loader = threading.Thread(target=load)
    loader.start()
    try:
        serving(register)
        serving(restored)
    finally:
        stop.set()
        loader.join(30)
    assert outcomes.count("ok") > 0 and set(outcomes) <= {"ok", "refused"}, sorted(set(outcomes))
