"""/openapi.json tells the truth: request bodies, statuses, the error body, content types, admin security."""

from __future__ import annotations

import pytest
from gateway_apps import ADMIN

JSON_POSTS = {
    "/v1/chat/completions": "OpenAIChatRequest",
    "/v1/images/generations": "OpenAIImageRequest",
    "/admin/apps": "RegisterApp",
    "/admin/apps/{name}/plan": "Plan",
}


@pytest.fixture
def document(gateway):
    return gateway.get("/openapi.json").json()


def test_json_routes_name_their_body_model_and_the_4xx_every_json_route_can_answer(document):
    for path, model in JSON_POSTS.items():
        post = document["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model}"
        }
        assert {"400", "413", "415"} <= set(post["responses"]), path
        assert "422" not in post["responses"], path  # invalid fields are a 400 on every route
    schemas = document["components"]["schemas"]
    assert schemas["OpenAIChatRequest"]["required"] == ["model", "messages"]
    assert "HTTPValidationError" not in schemas


def test_every_error_status_documents_the_one_error_body(document):
    error = document["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"message", "type", "code", "request_id"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (method, path, status)


def test_admin_routes_and_only_they_need_the_bearer_token(document):
    assert document["components"]["securitySchemes"]["AdminToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["AdminToken"]["description"],
    }
    for path, operations in document["paths"].items():
        for operation in operations.values():
            admin = path.startswith("/admin/")
            assert (operation.get("security") == [{"AdminToken": []}]) == admin, path
            assert ("401" in operation["responses"]) == admin, path


def test_streaming_routes_document_server_sent_events_and_metrics_plain_text(document):
    for path in ("/v1/chat/completions", "/v1/apps/{name}/invoke"):
        content = document["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}, path
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}


def test_a_405_allows_every_method_of_the_path(gateway):
    refused = gateway.put("/admin/apps", headers=ADMIN)
    assert refused.status_code == 405 and refused.json()["error"]["code"] is None
    assert {m.strip() for m in refused.headers["allow"].split(",")} >= {"GET", "POST"}


def test_openai_bodies_are_validated_as_documented_not_coerced(gateway):
    body = {"model": "answer", "messages": [{"role": "user", "content": "hi"}], "stream": 0}
    refused = gateway.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and "stream: Input should be a valid boolean" in refused.text
    part = {"type": "video_url", "video_url": None}
    missing = gateway.post(
        "/v1/chat/completions",
        json={**body, "stream": False, "messages": [{"role": "user", "content": [part]}]},
    )
    assert missing.status_code == 400 and "video_url" in missing.json()["error"]["message"]
