"""`prismserve serve MODEL`: family detection and plugins, the default apps (and `--write-app`), settings
from flags and a config file, hub downloads (a local fake hub), and a tiny Qwen2.5-Omni served with no
app file."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fake_hub import FakeHub, fake_hub
from tiers import uses

from prismserve.app import load_app, load_app_source
from prismserve.apps import default_app_source, demo_app_source
from prismserve.cli import _build_parser, main
from prismserve.models import EngineSettings, SettingError, families, family_for, family_of
from prismserve.models.builtin import BUILTIN, QWEN2_5_OMNI, QWEN2_5_VL, QWEN_IMAGE
from prismserve.serve.launch import ServeOptions, StartupError, app_source, prepare_server
from prismserve.serve.serve_command import ConfigError, settings

REPO = Path(__file__).resolve().parents[2]
TOY_APP = REPO / "tests" / "toy" / "omni_app.py"


def _checkpoint(root: Path, name: str, model_type: str) -> Path:
    """A directory holding only the config that names the family (all detection reads)."""
    path = root / name
    path.mkdir()
    if model_type.endswith("Pipeline"):
        (path / "model_index.json").write_text(json.dumps({"_class_name": model_type}))
    else:
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


def test_each_family_is_detected_from_its_checkpoint_config(tmp_path):
    for family in BUILTIN:
        path = _checkpoint(tmp_path, family.name, family.model_types[0])
        assert family_for(str(path)) is family
    with pytest.raises(Exception, match="no model family takes model_type 'bert'; supported: "):
        family_of("bert")


def test_default_apps_load_with_the_settings_in_place():
    for family in BUILTIN:
        app = load_app_source(default_app_source(family, "/ckpt/x"), f"Org/{family.name}")
        assert app.module.MODEL == "/ckpt/x" and len(app.unit_tasks()) >= 2  # encoders fissioned
    omni = load_app_source(default_app_source(QWEN2_5_OMNI, "/ckpt/o"), "omni")
    assert set(omni.named_unit_tasks()) == {
        "model.encoders.image", "model.encoders.video", "model.encoders.audio", "model.thinker",
        "model.talker", "model.vocoder",
    }  # fmt: skip
    assert omni.config.output_modalities == {"text", "audio"}
    assert omni.config.input_modalities == {"text", "image", "audio", "video"}
    # prismserve's vLLM executors take no video: on vLLM the default apps take none (no video encoder
    # started, a clip refused by the gateway, not after its encoding).
    for family in (QWEN2_5_OMNI, QWEN2_5_VL):
        on_vllm = load_app_source(default_app_source(family, "/ckpt/v", EngineSettings(engine="vllm")), "v")
        assert "video" not in on_vllm.config.input_modalities, family.name
        assert not any("video" in path for path in on_vllm.named_unit_tasks()), family.name
    vllm = EngineSettings(
        engine="vllm", dtype="bfloat16", max_model_len=8192, tensor_parallel_size=2, quantization="awq"
    )
    vl = load_app_source(default_app_source(QWEN2_5_VL, "/ckpt/vl", vllm), "vl").named_unit_tasks()[
        "model.llm"
    ]
    assert (type(vl).__name__, vl.gpus, vl.dtype, vl.max_model_len, vl.quantization) == (
        "VLLMTask", 2.0, "bfloat16", 8192, "awq",
    )  # fmt: skip
    split = EngineSettings(engine="vllm", prefill_decode=True, gpu_memory_utilization=0.4)
    units = load_app_source(default_app_source(QWEN2_5_VL, "/ckpt/vl", split), "pd").named_unit_tasks()
    llm = {path: (type(unit).__name__, unit.gpus) for path, unit in units.items() if "encoders" not in path}
    assert llm == {"model.prefill": ("VLLMPrefillTask", 0.4), "model.decode": ("VLLMDecodeTask", 0.4)}
    units = load_app_source(default_app_source(QWEN2_5_OMNI, "/ckpt/o", split), "opd").named_unit_tasks()
    thinker = {
        path: (type(unit).__name__, unit.gpus) for path, unit in units.items() if "encoders" not in path
    }
    assert thinker == {
        "model.prefill": ("VLLMThinkerPrefillTask", 0.4), "model.decode": ("VLLMThinkerDecodeTask", 0.4),
        "model.talker": ("TalkerTask", 1.0), "model.vocoder": ("VocoderTask", 1.0),
    }  # fmt: skip
    shared = default_app_source(QWEN2_5_OMNI, "/ckpt/o", EngineSettings(gpu_memory_utilization=0.4))
    assert load_app_source(shared, "o").named_unit_tasks()["model.thinker"].gpus == 0.4
    image = load_app_source(default_app_source(QWEN_IMAGE, "/ckpt/i"), "i").named_unit_tasks()
    assert set(image) == {"model.text_encoder", "model.generator"}
    # --dtype is every component's, on either engine (a float32 encoder beside a bfloat16 LLM computed
    # differently from the engine the user asked for).
    for family, engine in (
        (QWEN2_5_OMNI, "transformers"),
        (QWEN2_5_OMNI, "vllm"),
        (QWEN_IMAGE, "transformers"),
    ):
        flags = EngineSettings(engine=engine, dtype="bfloat16")
        units = load_app_source(default_app_source(family, "/ckpt/d", flags), "d").named_unit_tasks().values()
        assert units and {unit.dtype for unit in units} == {"bfloat16"}, family.name


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    """ruff with this repository's rules, on files outside it."""
    command = [sys.executable, "-m", "ruff", *args, "--config", str(REPO / "pyproject.toml"), "--no-cache"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_write_app_writes_the_app_served_for_each_family_and_the_demo(tmp_path, capsys):
    """`serve MODEL --write-app FILE` writes the default app with the checkpoint and the engine flags in
    place and starts nothing; the file is ruff-clean, loads, and deploys the same tasks as the app served."""
    written = []
    for family in BUILTIN:
        checkpoint = _checkpoint(tmp_path, family.name, family.model_types[0])
        out = tmp_path / f"{family.name.replace('.', '_')}_app.py"
        flags = ("--engine", "vllm", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.5") * (
            "vllm" in family.engines
        )
        assert main(["serve", str(checkpoint), *flags, "--write-app", str(out)]) == 0
        assert f"; serve it with `prismserve serve {out}`" in capsys.readouterr().err
        engine = (
            EngineSettings(engine="vllm", dtype="bfloat16", gpu_memory_utilization=0.5) if flags else None
        )
        source, name, _ = app_source(ServeOptions(str(checkpoint), engine=engine or EngineSettings()))
        assert out.read_text() == source == default_app_source(family, str(checkpoint), engine)
        served, copy = load_app_source(source, name), load_app(out)
        assert copy.named_unit_tasks() == served.named_unit_tasks() and str(checkpoint) == copy.module.MODEL
        assert copy.config.input_modalities == served.config.input_modalities
        assert (copy.request_model, copy.response_model) == (served.request_model, served.response_model)
        assert not flags or all(
            t.gpus == 0.5 for k, t in copy.named_unit_tasks().items() if k.endswith(family.main)
        )
        written.append(out)
    demo = tmp_path / "demo_app.py"
    demo.write_text(demo_app_source("/ckpt/tiny-omni", monolith=True))
    assert set(load_app(demo).named_unit_tasks()) == {"model.whole"}
    written.append(demo)
    for check in (("check", "--select", "E,F,B,UP,SIM,I,W"), ("format", "--check")):
        result = _ruff(*check, *map(str, written))
        assert result.returncode == 0, result.stdout + result.stderr


def test_each_app_module_is_itself_an_app():
    """The built-in app modules, as they are in the package, are app files with default settings."""
    from prismserve.apps import image, mllm, omni
    from prismserve.emulate import chat_app

    for module in (mllm, omni, image, chat_app):
        app = load_app(module.__file__, "builtin")
        assert app.module.SETTINGS == module.SETTINGS and app.named_unit_tasks()


def test_write_app_to_stdout_and_its_errors(tmp_path, capsys):
    checkpoint = _checkpoint(tmp_path, "vl", "qwen2_5_vl")
    assert main(["serve", str(checkpoint), "--write-app", "-"]) == 0
    assert capsys.readouterr().out == default_app_source(QWEN2_5_VL, str(checkpoint))
    for argv, message in (
        ([str(tmp_path / "none")], "no checkpoint directory there"),
        ([str(checkpoint), "--max-model-len", "64"], "--max-model-len only applies to the vLLM engine"),
        ([str(checkpoint), "--write-app", str(tmp_path / "no" / "dir" / "app.py")], "cannot write the app"),
    ):
        if "--write-app" not in argv:
            argv = [*argv, "--write-app", str(tmp_path / "app.py")]
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "family, given, message",
    [
        (QWEN2_5_OMNI, {"tensor_parallel_size": 2}, "--tensor-parallel-size only applies to the vLLM engine, not transformers (add --engine vllm)"),
        (QWEN2_5_VL, {"max_model_len": 64, "tensor_parallel_size": 2}, "--max-model-len, --tensor-parallel-size only apply"),
        (QWEN2_5_OMNI, {"quantization": "awq"}, "--quantization only applies to the vLLM engine, not transformers (add --engine vllm)"),
        (QWEN_IMAGE, {"engine": "vllm"}, "qwen-image does not run on --engine vllm; engines: transformers"),
        (QWEN2_5_VL, {"prefill_decode": True}, "--prefill-decode only applies to the vLLM engine, not transformers (add --engine vllm)"),
        (QWEN_IMAGE, {"engine": "vllm", "prefill_decode": True}, "qwen-image does not run on --engine vllm"),
    ],
)  # fmt: skip
def test_settings_that_do_not_apply_are_errors(family, given, message):
    with pytest.raises(SettingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        default_app_source(family, "/ckpt/x", EngineSettings(**given))


def test_an_app_file_refuses_model_settings():
    with pytest.raises(StartupError, match="--engine configures the default app of a model"):
        app_source(ServeOptions(str(TOY_APP), engine=EngineSettings(engine="vllm")))


PLUGIN = """
from prismserve.models import DefaultApp, ModelFamily

FAMILY = ModelFamily(
    name="fake-vl",
    model_types=("fake_vl",),
    adapter="fake_family:Adapter",
    app=DefaultApp(
        module="prismserve.apps.mllm",
        doc="A third-party vision-language family.",
        settings={"image_tokens": "fixed"},
    ),
)
"""


def test_a_plugin_family_is_found_through_its_entry_point(tmp_path, monkeypatch):
    """A third-party package declares its family in the `prismserve.models` entry point group."""
    site = tmp_path / "site"
    dist = site / "fake_family-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-family\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[prismserve.models]\nfake-vl = fake_family:FAMILY\n")
    (site / "fake_family.py").write_text(PLUGIN)
    checkpoint = _checkpoint(tmp_path, "fake-ckpt", "fake_vl")
    with pytest.raises(Exception, match="no model family takes model_type 'fake_vl'"):
        family_for(str(checkpoint))
    monkeypatch.syspath_prepend(str(site))
    assert "fake-vl" in [family.name for family in families()]
    assert family_for(str(checkpoint)).name == "fake-vl"
    source, name, _ = app_source(ServeOptions(str(checkpoint)))
    assert name == "fake-ckpt" and str(checkpoint) == load_app_source(source, name).module.MODEL
    assert source.startswith('"""A third-party vision-language family.') and 'image_tokens="fixed"' in source


# A plugin's own app module: its settings class in the module itself (the written copy keeps it).
PLUGIN_APP = """\"\"\"A third-party app.\"\"\"

from collections.abc import AsyncIterator

from prismserve.app import AppConfig, AppSettings
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask, chat_chunks


class Settings(AppSettings):
    model: str
    greeting: str = "hello"
    gpus: dict[str, float] = {}


SETTINGS = Settings(model="acme/vl")  # the one statement

model = MLLMTask(model=SETTINGS.model, gpus=SETTINGS.gpus)


class Config(AppConfig):
    tasks = {"model": model}


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await model(request)):
        yield chunk
"""


def test_a_plugin_family_may_bring_its_own_app_module(tmp_path, monkeypatch):
    from prismserve.models import DefaultApp, ModelFamily

    (tmp_path / "acme_app.py").write_text(PLUGIN_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    own = DefaultApp(module="acme_app", doc="Acme-VL.", settings={"greeting": "hi"})
    family = ModelFamily(name="acme", model_types=("acme",), adapter="acme:A", app=own)
    source = default_app_source(family, "/ckpt/acme", EngineSettings(gpu_memory_utilization=0.5))
    assert (
        'SETTINGS = Settings(\n    model="/ckpt/acme",\n    greeting="hi",\n    gpus={"llm": 0.5},\n)  # the one'
        in source
    )
    assert load_app_source(source, "acme").named_unit_tasks()["model.llm"].gpus == 0.5
    for app, message in (
        (own.model_copy(update={"settings": {"greting": "hi"}}), "greting: Extra inputs are not permitted"),
        (own.model_copy(update={"module": "no_such_app"}), "acme's default app no_such_app does not import"),
        (own.model_copy(update={"module": "json"}), "has no `SETTINGS = ...` statement"),
    ):
        broken = ModelFamily(name="acme", model_types=("acme",), adapter="acme:A", app=app)
        with pytest.raises(SettingError, match=message):
            default_app_source(broken, "/ckpt/acme")


def _serve_args(*argv: str) -> dict[str, object]:
    return settings(_build_parser().parse_args(["serve", *argv]))


def test_a_config_file_holds_every_flag_and_the_command_line_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("PRISMSERVE_API_KEY", raising=False)
    config = tmp_path / "serve.yaml"
    config.write_text(
        textwrap.dedent("""\
            model: Qwen/Qwen2.5-Omni-7B
            served-model-name: omni
            engine: vllm
            dtype: bfloat16
            max_model_len: 8192
            gpu-memory-utilization: 0.5
            tensor-parallel-size: 1
            port: 9000
            host: 0.0.0.0
            log-level: info
            access-log: false
            offline: true
            api-key: from-file
            allowed-media-domains: [example.com, cdn.example.com]
            fake-gpus: 4
            write-app: app.py
            component-gib: {thinker: 30, talker: 6.5}
        """)
    )
    merged = _serve_args("--config", str(config), "--port", "9001", "--access-log", "/ckpt/other")
    assert merged["model"] == "/ckpt/other" and merged["port"] == 9001 and merged["access_log"] is True
    assert (merged["name"], merged["engine"], merged["dtype"], merged["max_model_len"]) == (
        "omni", "vllm", "bfloat16", 8192,
    )  # fmt: skip
    assert (merged["gpu_memory_utilization"], merged["host"], merged["log_level"], merged["offline"]) == (
        0.5, "0.0.0.0", "info", True,
    )  # fmt: skip
    assert merged["api_key"] == "from-file" and merged["fake_gpus"] == 4 and merged["write_app"] == "app.py"
    assert merged["allowed_media_domains"] == ("example.com", "cdn.example.com")
    assert merged["component_gib"] == {"thinker": 30.0, "talker": 6.5}
    assert _serve_args("m", "--component-gib", "talker=4")["component_gib"] == {"talker": 4.0}
    defaults = _serve_args("Qwen/Qwen2.5-Omni-7B")
    assert (defaults["port"], defaults["host"], defaults["access_log"], defaults["api_key"]) == (
        8000, "127.0.0.1", True, None,
    )  # fmt: skip
    assert defaults["replan"] is True and _serve_args("m", "--gpus", "4", "--no-replan")["replan"] is False
    monkeypatch.setenv("PRISMSERVE_API_KEY", "from-env")
    assert _serve_args("m")["api_key"] == "from-env" and _serve_args("m", "--api-key", "k")["api_key"] == "k"


def test_config_file_mistakes_name_the_file(tmp_path):
    config = tmp_path / "serve.yaml"
    for text, message in (
        ("prot: 8000\n", "unknown setting 'prot'; settings: model, "),
        ("port: eighty\n", "setting port: invalid int value: 'eighty'"),
        ("gpu-memory-utilization: 2\n", "a share of one GPU is 0 < x <= 1, not 2"),
        ("component-gib: {thinker: lots}\n", "expected COMPONENT=GIB pairs .thinker=30., got 'thinker=lots'"),
        ("component-gib: {thinker: 0}\n", "expected COMPONENT=GIB with GIB > 0, got 'thinker=0'"),
        ("- port\n", "must be a mapping of settings, not list"),
    ):
        config.write_text(text)
        with pytest.raises(ConfigError, match=f"^{config}: .*{message}"):
            _serve_args("--config", str(config))


def test_api_key_and_media_domains_reach_the_gateway():
    from toy.executors import EXECUTORS

    from prismserve.runtime import LocalRuntime

    options = ServeOptions(
        str(TOY_APP), port=0, api_key="sk-test", allowed_media_domains=("example.com",), access_log=False
    )
    server = prepare_server(options, runtime=LocalRuntime(EXECUTORS))
    try:
        gateway = server.server.config.app.state.gateway
        assert gateway.api_key == "sk-test" and gateway.media.allowed_domains == ("example.com",)
        assert server.server.config.access_log is False
    finally:
        server.listener.close()


def _env(hub_url: str, home: Path, **more: str) -> dict[str, str]:
    env = {**os.environ, "HF_ENDPOINT": hub_url, "HF_HOME": str(home), "PYTHONPATH": str(REPO), **more}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        if name not in more:
            env.pop(name, None)
    return env


def test_hub_ids_download_from_the_hub_and_failures_are_one_line(tmp_path, tiny_omni_dir):
    """Downloads, the cache when offline, and a gated, a missing and an uncached model (exit 2)."""
    hub = FakeHub({"tiny/omni": tiny_omni_dir}, gated={"tiny/gated"})
    resolve = (
        "from prismserve.models.hub import resolve_checkpoint; from prismserve.models import family_for; "
        "path = resolve_checkpoint('tiny/omni'); print(path, family_for(str(path)).name)"
    )
    with fake_hub(hub) as url:
        online = subprocess.run(
            [sys.executable, "-c", resolve], env=_env(url, tmp_path), capture_output=True, text=True
        )
        assert online.returncode == 0, online.stderr
        snapshot, family = online.stdout.split()
        assert family == "qwen2.5-omni" and Path(snapshot).is_relative_to(tmp_path)
        assert (Path(snapshot) / "config.json").read_bytes() == (tiny_omni_dir / "config.json").read_bytes()
        assert "Fetching" in online.stderr  # huggingface_hub's progress bars
        served = len(hub.requests)
        offline = _env(url, tmp_path, HF_HUB_OFFLINE="1")
        cached = subprocess.run([sys.executable, "-c", resolve], env=offline, capture_output=True, text=True)
        assert cached.returncode == 0 and cached.stdout.split()[0] == snapshot, cached.stderr
        assert len(hub.requests) == served  # offline: the cache only
        for model, env, message in (
            ("tiny/gated", _env(url, tmp_path), "error: tiny/gated is gated: accept its licence"),
            ("tiny/missing", _env(url, tmp_path), "error: tiny/missing: no such model on the hub"),
            ("tiny/other", offline, "error: tiny/other is not in the hub cache"),
            ("./no/such/dir", _env(url, tmp_path), "error: ./no/such/dir: no checkpoint directory there"),
        ):
            failed = subprocess.run(
                [sys.executable, "-m", "prismserve", "serve", model, "--port", "0"],
                env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120,
            )  # fmt: skip
            assert failed.returncode == 2 and failed.stderr.startswith(message), failed.stderr
            assert failed.stderr.count("\n") == 1 and failed.stdout == ""
        ran_offline = subprocess.run(
            [sys.executable, "-m", "prismserve", "serve", "tiny/omni", "--offline", "--max-model-len", "64"],
            env=_env(url, tmp_path), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        # --offline found the snapshot in the cache, detected its family, then refused the setting.
        assert ran_offline.returncode == 2 and ran_offline.stderr.startswith(
            "error: --max-model-len only applies"
        )


@pytest.fixture(scope="module")
def tiny_omni_dir() -> Path:
    from prismserve.models import tiny

    return tiny.build("qwen2.5-omni")


@pytest.mark.parametrize(("family", "gpus"), [("qwen2.5-omni", 1), ("qwen3-omni", 2)])
def test_an_omni_model_fits_the_gpus_it_has_with_no_app_file(family, gpus, tmp_path):
    """The on-ramp: six components (encoders of images, video and audio, thinker, talker, vocoder) on
    one declared GPU (or two): `prismserve serve DIR --fake-gpus N`
    lays them onto it with shares from their weights, says so (not: waits for GPUs and fails), and
    answers the official `openai` client — image and text in, text out; speech in, text and speech
    out; a realtime session's spoken turn and barge-in — then stops cleanly on SIGTERM."""
    import openai
    from PIL import Image

    from prismserve.bench.workloads import workloads_dir
    from prismserve.models import tiny

    wav = (workloads_dir() / "media" / "query_to_cars.wav").read_bytes()
    png = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 30, 30)).save(png, format="PNG")
    image = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    model = tiny.build(family)
    with _serving(str(model), "--fake-gpus", str(gpus)) as (process, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=240)
        (listed,) = client.models.list().data
        assert listed.id == model.name and listed.owned_by == "prismserve"
        assert listed.model_extra["root"] == str(model.resolve())
        picture = {"type": "image_url", "image_url": {"url": image}}
        seen = client.chat.completions.create(
            model=model.name,
            max_tokens=8,
            messages=[{"role": "user", "content": [picture, {"type": "text", "text": "What is in it?"}]}],
        )
        assert seen.choices[0].message.content  # random weights: some text
        spoken = {
            "type": "input_audio",
            "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
        }
        heard = client.chat.completions.create(
            model=model.name,
            max_tokens=4,
            modalities=["text", "audio"],
            audio={"format": "wav"},  # type: ignore[typeddict-item]  # the model's default voice
            messages=[{"role": "user", "content": [spoken]}],  # type: ignore[list-item]
        )
        status = httpx.get(f"{url}/admin/status", headers={"Authorization": "Bearer t"}).json()
        realtime = [REPO / "benchmarks" / "bench_realtime.py", "--url", url, "--model", model.name]
        realtime += ["--admin-token", "t", "--rounds", "1", "--out", tmp_path / "realtime.json"]
        subprocess.run([sys.executable, *map(str, realtime)], check=True, timeout=240)
        (spoken_round,) = json.loads((tmp_path / "realtime.json").read_text())["rounds"]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out == "prismserve: stopped\n" and "Traceback" not in err, err
    check_realtime_round(spoken_round)
    message = heard.choices[0].message
    assert message.content and base64.b64decode(message.audio.data)[:4] == b"RIFF"
    assert f"shares {gpus} GPU" in err and "thinker 0." in err
    replicas = [r for d in status["deployments"].values() for r in d["replicas"]]
    assert len(replicas) == 6 and all(0 < r["gpus"] < 1 for r in replicas)
    assert status["gpus"]["total"] == gpus


def check_realtime_round(spoken_round: dict[str, Any]) -> None:
    """A realtime session's round through the official `openai` client (`benchmarks/bench_realtime.py`):
    a spoken turn detected, committed and answered with a transcript and speech, usage in
    `response.done`; then the user speaking during a spoken answer cancels it: no audio after the
    speech started, and the talker's and vocoder's calls end."""
    turn, barge_in = spoken_round["turn"], spoken_round["barge_in"]
    kinds = turn["kinds"]
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.output_audio.delta")
    assert turn["status"] == "completed" and turn["transcript"] and turn["audio_s"] > 0
    assert turn["usage"]["input_tokens"] > 0 and turn["usage"]["output_tokens"] > 0
    assert barge_in["status"] == "cancelled" and barge_in["audio_deltas_after_speech"] == 0
    # The talker was at work when the user spoke (the vocoder works in bursts: Qwen3-Omni's decodes
    # two seconds of speech in milliseconds), and after the cancel it did under a quarter of the work
    # a whole answer takes (the tiny talker speaks to its last code, max_codes): it used to speak on
    # to that code, unheard. Work is counted in CPU seconds, which a loaded machine stretches less
    # than wall time. The vocoder finishes the push it is decoding, which holds every code that piled
    # up while the last one decoded (0.3 of an answer's work on a quiet machine, more under load), so
    # it is only held to less than a whole answer: it can decode no more than the talker made.
    assert barge_in["busy_cores"]["TalkerTask"] > 0.25
    after = {stage: barge_in[f"{stage}_cpu_after_done_s"] for stage in ("TalkerTask", "VocoderTask")}
    whole = {stage: turn[f"{stage}_cpu_s"] for stage in ("TalkerTask", "VocoderTask")}
    assert after["TalkerTask"] < whole["TalkerTask"] / 4, (after, whole)
    assert after["VocoderTask"] < whole["VocoderTask"], (after, whole)


@uses("serve")
@contextlib.contextmanager
def _serving(
    *args: str, deadline: float = 280, before: list[str] | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`python -m prismserve serve ARGS… --port 0`: (the process, its URL) once /health answers; killed
    if it has not announced itself within `deadline` seconds or is still running at the end. Lines it
    prints before announcing itself (a plan made at start) go to `before`."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
        "PRISMSERVE_ADMIN_TOKEN": "t",
        # Declared GPUs (--fake-gpus, or the test cluster's joined with --address): replicas run on
        # the CPU, as the server passes its own PRISMSERVE_DEVICE on to them.
        "PRISMSERVE_DEVICE": "cpu",
        **(env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "prismserve", "serve", *args, "--port", "0"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a group of its own, as a terminal gives a command: tests may signal it
    )  # fmt: skip
    watchdog = threading.Timer(deadline, process.kill)
    watchdog.start()
    try:
        first = process.stdout.readline() if process.stdout else ""  # printed once the app is registered
        while first.startswith("prismserve: planned ") and process.stdout:
            (before if before is not None else []).append(first)
            first = process.stdout.readline()
        watchdog.cancel()
        assert first.startswith("prismserve: serving app "), process.stderr.read() if process.stderr else ""
        url = first.rsplit(" ", 1)[1].strip()
        until = time.monotonic() + 30
        while httpx.get(f"{url}/health", timeout=5).status_code != 200:
            assert time.monotonic() < until, "the gateway never answered /health"
            time.sleep(0.1)
        yield process, url
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
@pytest.mark.reliability
def test_a_served_vllm_app_exports_its_metrics_and_stopped_leaves_no_process_or_shared_memory(stop):
    """vLLM's engine metrics (KV-cache use among them) reach /metrics labelled with their deployment
    and replica, beside the stage's own; every metric the Grafana dashboard reads is exported.

    After SIGTERM or Ctrl-C to its process group, no process the server started (Ray's, the replicas', vLLM's engine
    core and worker) is alive and no shared-memory segment they mapped is left in /dev/shm. vLLM's
    engine core and worker once outlived the server, holding their memory, and each run left
    vLLM's 160 MB message queue behind."""
    import psutil
    from metrics_helpers import dashboard_metrics, exported

    from prismserve.models import tiny

    model = str(tiny.build("qwen2.5-vl"))
    started: list[psutil.Process] = []
    quiet = {"VLLM_LOGGING_LEVEL": "ERROR"}  # what is printed must fit the pipe until it is read
    try:
        with _serving(model, "--engine", "vllm", "--fake-gpus", "3", env=quiet) as (process, url):
            body = {
                "model": Path(model).name,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            }
            assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
            check_vllm_metrics(
                exported(httpx.get(f"{url}/metrics", timeout=30).text), model, dashboard_metrics()
            )
            started = psutil.Process(process.pid).children(recursive=True)
            mapped = {m.path for p in started for m in _maps(p) if m.path.startswith("/dev/shm/")}
            assert any(p.name().startswith("VLLM::EngineCor") for p in started), [p.name() for p in started]
            assert mapped, "vLLM's message queue is shared memory: the check would find nothing"
            os.killpg(process.pid, stop)  # as Ctrl-C in a terminal or a supervisor's stop: the whole group
            _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        _, alive = psutil.wait_procs(started, timeout=20)
        assert not alive, [(p.pid, p.name()) for p in alive]
        assert not [path for path in mapped if os.path.exists(path)]
    finally:  # nothing left to the next tests, whatever failed
        for leftover in started:
            with contextlib.suppress(psutil.Error):
                leftover.kill()


def check_vllm_metrics(samples: dict[str, Any], model: str, dashboard: set[str]) -> None:
    """A served tiny VL's /metrics after one answer: vLLM's engine metrics per replica and deployment,
    the stage's own time to first token, and whatever the dashboard reads."""
    (kv,) = samples["vllm:kv_cache_usage_perc"]
    assert kv.labels["replica"] and "VLLMTask" in kv.labels["deployment"] and 0 <= kv.value <= 1
    assert any(s.value >= 1 for s in samples["vllm:request_success_total"])  # the engine's own count
    first = [
        s for s in samples["prismserve:time_to_first_token_seconds_count"] if s.labels["stage"] == "VLLMTask"
    ]
    assert first and first[0].value >= 1 and first[0].labels["model_name"] == model
    assert dashboard <= set(samples), sorted(dashboard - set(samples))


@pytest.mark.reliability
def test_a_server_whose_local_ray_lost_its_gcs_still_stops_at_once():
    """A server whose local Ray has lost its GCS (a crash, or the first to go of a process group
    stopped by a signal) stops on SIGTERM with status 0, leaving nothing of Ray running. Its health
    check asked the dead GCS for its nodes on the event loop, which held the server until Ray gave up
    on its GCS (60 s) and ended the process with status 1; the stopped-server test above met it when
    the check fell in the second its Ray and the server stopped together. The admin status answers
    meanwhile, saying so (it asked the dead GCS too)."""
    import psutil
    from toy import APP_PATH

    with _serving(str(APP_PATH), "--fake-gpus", "5") as (process, url):
        started = psutil.Process(process.pid).children(recursive=True)
        (gcs,) = [p for p in started if p.name().startswith("gcs_server")]
        gcs.kill()
        gcs.wait(10)
        time.sleep(3)  # past a health check (every 2 s) with the GCS gone
        # The admin status asked Ray for its nodes too: it held the server the same way.
        status = _admin(url, "status", timeout=10)
        assert status.status_code == 200 and "lost its GCS" in status.json()["ray"]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=40)  # not the 60 s of Ray's wait for its GCS
    assert process.returncode == 0 and out == "prismserve: stopped\n", err
    assert "the local Ray lost its GCS or raylet" in err
    _, alive = psutil.wait_procs(started, timeout=20)
    assert not alive, [(p.pid, p.name()) for p in alive]


def _maps(process: Any) -> list[Any]:
    """The memory maps of `process`, none if it has gone or is not ours to read."""
    import psutil

    try:
        return process.memory_maps()
    except psutil.Error:
        return []


def test_serve_plans_for_its_gpus_at_start_and_routes_without_a_router(tmp_path):
    """`serve APP --gpus all`: the app is profiled on this hardware (and the profile cached), planned for
    the cluster's GPUs and deployed; requests of each type are answered along the plan's paths (the toy
    app has no Router)."""
    from toy import APP_PATH

    before: list[str] = []
    cache = {"PRISMSERVE_PROFILE_CACHE": str(tmp_path)}
    with _serving(str(APP_PATH), "--fake-gpus", "6", "--gpus", "all", before=before, env=cache) as (
        process,
        url,
    ):
        (line,) = before
        assert line.startswith("prismserve: planned 'omni_app' for 6 GPUs: ") and "req/s predicted" in line
        status = _admin(url, "status").json()
        assert sum(c["gpus"] for c in status["cells"]) == 6
        plan = _admin(url, "apps/omni_app/plan").json()
        assert plan["options"]["omni.thinker.llm"] == {"omni.thinker.llm": 1.0}  # laid out on the app
        assert sum(n * c["count"] for c in plan["cells"] for n in c["replicas"].values()) == 6
        _answers_text_and_an_image(url, "omni_app")
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert process.returncode == 0
    (profile,) = tmp_path.glob("omni_app-*.yaml")
    assert profile.read_text().startswith("# profile of: omni_app\n")


def test_a_model_planned_on_fewer_gpus_than_components_is_colocated_by_the_planner(tmp_path):
    """`serve MODEL --gpus all` on one declared GPU: the tiny Qwen2.5-VL's three components are
    profiled packed on it (their fit, `serve.fit.planning_shares`), the planner is offered that
    packing as a colocated option beside each component's solo option, and plans it: one replica of
    each on the GPU, answering text and image requests. (Before, each took a whole GPU: the server
    waited for GPUs the cluster does not have and failed; and the default workload's video request,
    longer than the tiny model's context, failed the profile.)"""
    from prismserve.models import tiny

    model = tiny.build("qwen2.5-vl")
    before: list[str] = []
    cache = {"PRISMSERVE_PROFILE_CACHE": str(tmp_path)}
    with _serving(str(model), "--fake-gpus", "1", "--gpus", "all", before=before, env=cache) as (
        process,
        url,
    ):
        (line,) = before
        assert line.startswith(f"prismserve: planned {model.name!r} for 1 GPUs: ")
        plan = _admin(url, f"apps/{model.name}/plan").json()
        ((name, layout),) = [(n, o) for n, o in plan["options"].items() if "+" in n and n in line]
        assert len(layout) == 3 and sum(layout.values()) <= 1.0  # the three share the one GPU
        (profile,) = [p for p in tmp_path.glob("*.yaml") if not p.name.endswith(".budgets.yaml")]
        spec = yaml.safe_load(profile.read_text())
        options = {o["name"]: o["components"] for o in spec["options"]}
        assert options[name] == list(layout) and all([c] == options[c] for c in layout)  # solo ones too
        assert "image+text" in {t["name"] for t in spec["request_types"]}
        _answers_text_and_an_image(url, model.name)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0
    # Some of the default workload's video requests are longer than the tiny model's context: they
    # are refused while profiling and left out (they failed the start before), the rest planned.
    (refused,) = [line for line in err.splitlines() if "requests of the profile's workload" in line]
    assert "image+text+video requests" in refused and "context is 4096 tokens" in refused


def _admin(url: str, route: str, timeout: float = 30) -> httpx.Response:
    """GET an admin route of a server `_serving` started (its admin token is `t`)."""
    return httpx.get(f"{url}/admin/{route}", headers={"authorization": "Bearer t"}, timeout=timeout)


def _answers_text_and_an_image(url: str, model: str) -> None:
    """The served `model` answers a text and an image request through the `openai` client."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    image = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": _PNG}}]
    for content in ("hello", image):
        answer = client.chat.completions.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": content}]
        )
        assert answer.choices[0].message.content


_PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="


def test_the_gateways_socket_takes_connections_before_uvicorn_serves():
    """`prismserve serve` prints its URL before uvicorn's serve() begins: a client that connects then
    waits in the socket's backlog instead of being refused (the bound socket now listens)."""
    import socket

    from prismserve.serve.launch import _listen

    listener = _listen("127.0.0.1", 0)
    try:
        socket.create_connection(listener.getsockname()[:2], timeout=2).close()
    finally:
        listener.close()
