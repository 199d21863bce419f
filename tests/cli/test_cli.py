"""The `prismserve` command: help, and the in-process demo that the README's main command runs."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

from prismserve.cli import main


def prismserve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.join(os.getcwd(), "tests")])}
    return subprocess.run(
        [sys.executable, "-m", "prismserve", *args], capture_output=True, text=True, env=env, timeout=280
    )


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "plan" in out


def test_console_script_is_declared():
    (script,) = metadata.entry_points(group="console_scripts", name="prismserve")
    assert script.value == "prismserve.cli:main"


def test_in_process_demo_prints_each_recorded_graph_and_response():
    result = prismserve("demo", "--in-process")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tiny Qwen2.5-Omni (random weights) at " in out and "deployments: 5" in out
    # Text only: the thinker alone. An image: the image encoder feeds the thinker.
    assert "recorded graph of OmniTask: 1 unit-task invocations" in out
    assert "#1 ThinkerTask  executor=mm-thinker inputs: 0.embeddings from #0, 0.meta from #0" in out
    # Speech out: the talker reads the thinker's conditioning, the vocoder the talker's codes.
    assert "#2 TalkerTask   executor=mm-talker  inputs: 1.talker from #1" in out
    assert "#3 VocoderTask  executor=mm-vocoder inputs: 2 from #2" in out
    assert out.count("response: text='") == 3 and "samples at 24000 Hz" in out


@pytest.mark.ray  # the demo starts a Ray of its own
def test_server_demo_answers_chat_requests_over_http():
    """The README's main job: a tiny Qwen2.5-Omni on the Ray runtime with declared GPUs, via the gateway."""
    result = prismserve("demo", "--fake-gpus", "6")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Ray runtime with 6 declared GPUs" in out
    assert out.count(": 1 GPU on node ") == 5  # one single-replica cell per component
    for kind in ("mm-encoder", "mm-thinker", "mm-talker", "mm-vocoder"):
        assert f": {kind}" in out
    assert "POST /v1/chat/completions  (image+text)" in out
    assert "POST /v1/chat/completions  (audio+text->audio)" in out
    assert out.count("response: '") == 3 and "samples at 24000 Hz" in out


def test_demo_json_prints_graphs_that_parse():
    import json

    result = prismserve("demo", "--in-process", "--json")
    assert result.returncode == 0, result.stderr
    docs = []
    decoder = json.JSONDecoder()
    text = result.stdout
    index = text.find('{\n  "version"')
    while index != -1:
        doc, end = decoder.raw_decode(text, index)
        docs.append(doc)
        index = text.find('{\n  "version"', end)
    assert [len(d["nodes"]) for d in docs] == [1, 2, 4]


def test_check_lists_deployments_of_a_valid_app():
    from toy import APP_PATH

    result = prismserve("check", str(APP_PATH))
    assert result.returncode == 0, result.stderr
    assert "app 'omni_app': serve(ChatRequest) streams ChatChunk; tasks: omni" in result.stdout
    assert "5 unit-task deployments" in result.stdout
    assert "executor=vocoder  gpus/replica=1" in result.stdout
    # Each deployment by its path in the app: the names plans and profiles use.
    assert "\n  omni.thinker.llm  LLMTask  executor=llm  gpus/replica=1\n" in result.stdout


def test_check_reports_a_bad_app_in_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from prismserve.app import AppConfig\nclass Config(AppConfig):\n    tasks = {}\n")
    result = prismserve("check", str(bad))
    assert result.returncode == 2
    assert result.stderr == f"error: {bad}: Config.tasks must be a non-empty dict of name -> task\n"


def test_check_refuses_unserialisable_unit_task_configuration_in_one_line(tmp_path):
    bad = tmp_path / "locked.py"
    bad.write_text(
        "import threading\n"
        "from prismserve.app import AppConfig\n"
        "from toy.tasks import EncoderTask\n"
        "class Locked(EncoderTask):\n    guard: object = None\n"
        "class Config(AppConfig):\n    tasks = {'e': Locked(model_id='m', modality='image', guard=threading.Lock())}\n"
    )
    result = prismserve("check", str(bad))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {bad}:7: Locked.guard cannot be serialised (")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
