"""`GET /v1/models`: the served apps in OpenAI's list shape, read by the official `openai` client; app
names with '/' (hub ids) on every route that names an app."""

from __future__ import annotations

import openai
import pytest
from gateway_apps import ADMIN, APPS


def test_openai_client_lists_the_served_apps(chat):
    models = chat.models.list().data
    assert [m.id for m in models] == ["answer", "embed", "omni"]
    omni = models[-1]
    assert (omni.object, omni.owned_by) == ("model", "prismserve") and omni.created > 1_700_000_000
    assert omni.model_extra["input_modalities"] == ["audio", "image", "text"]
    assert "root" not in omni.model_extra  # a toy app names no checkpoint
    assert chat.models.retrieve("omni").id == "omni"
    with pytest.raises(openai.NotFoundError, match="no app named 'gpt-4'"):
        chat.models.retrieve("gpt-4")


def test_the_list_is_openais_shape(gateway):
    body = gateway.get("/v1/models").json()
    assert body["object"] == "list" and {"id", "object", "created", "owned_by"} <= set(body["data"][0])


def test_hub_id_app_names_work_on_every_route(gateway, chat):
    """`prismserve serve Qwen/Qwen2.5-Omni-7B` names its app after the hub id."""
    name = "Org/Embed-1.5B"
    source = APPS["embed"] + "\nMODEL = '/ckpt/embed'\n"
    registered = gateway.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN)
    assert registered.status_code == 201, registered.text
    card = chat.models.retrieve(name)
    assert card.id == name and card.model_extra["root"] == "/ckpt/embed"
    invoked = gateway.post(f"/v1/apps/{name}/invoke", json={"data": "img"})
    assert invoked.status_code == 200 and invoked.json()["values"], invoked.text
    plan = gateway.post("/admin/apps/Org/nope/plan", json={}, headers=ADMIN)
    assert plan.status_code == 404 and "no app named 'Org/nope'" in plan.text
    assert gateway.delete(f"/admin/apps/{name}", headers=ADMIN).json() == {"unregistered": name}
    bad = gateway.post("/admin/apps", json={"name": "../etc", "source": source}, headers=ADMIN)
    assert bad.status_code == 400 and "app name '../etc' is invalid" in bad.text
