"""Chat wire types: parts, derived views, validation."""

import pytest

from prismserve.protocol.chat import AudioPart, ChatRequest, ImagePart


def test_one_message_request_keeps_media_in_order_and_flags_audio_out():
    request = ChatRequest.of("look and listen", images=[b"i1", b"i2"], audios=[b"a1"], audio_out=True)
    assert request.prompt == "user: look and listen"
    assert [p.data for p in request.images] == [b"i1", b"i2"]
    assert [p.data for p in request.audios] == [b"a1"]
    assert request.wants_audio and request.modalities == ["text", "audio"]
    assert not ChatRequest.of("text only").wants_audio


def test_parts_are_told_apart_by_type_in_json():
    request = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                {
                    "role": "user",
                    "content": [{"type": "image", "data": "cG5n"}, {"type": "audio", "data": "d2F2"}],
                },
            ]
        }
    )
    assert isinstance(request.images[0], ImagePart) and isinstance(request.audios[0], AudioPart)
    assert request.prompt == "system: be brief\nuser: "


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": []}]}, "role"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "data": ""}]}]}, "content"),
        ({"messages": [{"role": "user", "content": []}], "modalities": ["image"]}, "modalities"),
        ({"messages": [{"role": "user", "content": []}], "temperature": 3}, "temperature"),
    ],
)
def test_invalid_requests_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        ChatRequest.model_validate(bad)
