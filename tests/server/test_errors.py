"""Bad input gets a clear 4xx in OpenAI's error shape, and nothing is left running."""
from __future__ import annotations

import pytest

from tests.server.live import LiveServer, server_config, tiny_loader


def _error(response, status: int, code: str, param: str | None = "__any__") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    if param != "__any__":
        assert error["param"] == param, error
    assert error["message"]
    return error


def test_empty_input(server):
    _error(server.speech(input=""), 400, "invalid_parameter", "input")


def test_whitespace_only_input(server):
    _error(server.speech(input="   \n "), 400, "invalid_input", "input")


def test_input_over_the_character_limit(server):
    _error(server.speech(input="word " * 20_000), 400, "input_too_long", "input")


def test_control_characters(server):
    _error(server.speech(input="Hello\x00 there\x07"), 400, "invalid_input", "input")


def test_unknown_voice(server):
    _error(server.speech(input="Hi.", voice="no-such-voice"), 400, "voice_not_found", "voice")


def test_unknown_model(server):
    _error(server.speech(input="Hi.", model="tts-9000"), 400, "model_not_found", "model")


def test_missing_model(server):
    _error(server.client.post("/v1/audio/speech", json={"input": "Hi."}), 400, "invalid_parameter", "model")


@pytest.mark.parametrize("field, value", [
    ("speed", 0.1), ("speed", 5.0), ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("min_p", 2),
    ("top_k", -3), ("repetition_penalty", 0), ("seed", -1), ("exaggeration", 9), ("cfg_weight", -0.5),
    ("response_format", "ogg"), ("stream_format", "websocket"), ("priority", "urgent"), ("deadline_s", 0),
    ("flow_steps", 0), ("max_new_tokens", 0),
    ("top_k", True), ("seed", "5"), ("speed", "1.5"), ("temperature", False), ("voice", 7),  # wrong JSON types
])
def test_parameter_out_of_range(server, field, value):
    _error(server.speech(input="Hi.", **{field: value}), 400, "invalid_parameter", field)


def test_unknown_field_is_rejected_not_ignored(server):
    _error(server.speech(input="Hi.", cfg=0.3), 400, "invalid_parameter", "cfg")


def test_max_new_tokens_above_the_server_cap(server):
    _error(server.speech(input="Hi.", max_new_tokens=10_000), 400, "invalid_parameter", "max_new_tokens")


def test_deadline_above_the_server_maximum(server):
    _error(server.speech(input="Hi.", deadline_s=10_000), 400, "invalid_parameter", "deadline_s")


def test_instructions_are_refused(server):
    _error(server.speech(input="Hi.", instructions="whisper"), 400, "unsupported_parameter", "instructions")


def test_unsupported_language(server):
    _error(server.speech(input="Hi.", language="xx"), 400, "unsupported_language", "language")


def test_malformed_json(server):
    response = server.client.post("/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()


def test_body_over_the_size_limit(server):
    huge = {"model": "chatterbox-turbo", "input": "x" * (2 << 20)}
    _error(server.client.post("/v1/audio/speech", json=huge), 413, "body_too_large")


def test_unknown_route_is_a_json_404(server):
    _error(server.client.get("/v1/nothing-here"), 404, "not_found")


@pytest.mark.parametrize("method, path, allowed", [
    ("PUT", "/v1/voices/default", {"GET", "DELETE"}),  # GET and DELETE are two routes
    ("OPTIONS", "/v1/voices", {"GET", "POST"}),
    ("GET", "/v1/audio/speech", {"POST"}),
])
def test_a_wrong_method_is_a_405_naming_every_allowed_one(server, method, path, allowed):
    response = server.client.request(method, path)
    _error(response, 405, "method_not_allowed")
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed


def test_bad_input_leaves_nothing_running(server):
    for body in ({"input": ""}, {"input": "Hi.", "voice": "nope"}, {"input": "Hi.", "top_p": 7}):
        server.speech(**body)
    server.wait_idle()
    assert server.service.admission.in_flight == 0


def test_api_keys_are_required_when_configured(tmp_path):
    config = server_config(tmp_path, api_keys=("secret-key-1",))
    with LiveServer(config, tiny_loader(config), api_key="secret-key-1") as live:
        assert live.client.get("/v1/models").status_code == 200
        _error(live.client.get("/v1/models", headers={"Authorization": "Bearer wrong-key-0"}), 401, "invalid_api_key")
        _error(live.client.get("/v1/models", headers={"Authorization": ""}), 401, "invalid_api_key")
        assert live.client.get("/health", headers={"Authorization": ""}).status_code == 200  # probes need no key


def test_malformed_multipart_upload_is_invalid_multipart(server):
    response = server.client.post("/v1/voices", content=b"--nope\r\nbroken",
                                  headers={"content-type": "multipart/form-data; boundary=b"})
    _error(response, 400, "invalid_multipart")


@pytest.mark.parametrize("content, content_type", [
    (b'["Hi."]', "application/json"),
    (b'"Hi."', "application/json"),
    (b"model=chatterbox-turbo&input=Hi.", "application/x-www-form-urlencoded"),
    (b"", "application/json"),
])
def test_a_body_that_is_not_a_json_object_is_invalid_body(server, content, content_type):
    response = server.client.post("/v1/audio/speech", content=content, headers={"content-type": content_type})
    error = _error(response, 400, "invalid_body", None)
    assert "JSON object" in error["message"]
