"""`prismserve bench` against a live gateway: an open-loop run, its JSON, its plot, its errors."""

from __future__ import annotations

import json

import pytest
from toy import APP_PATH
from toy.executors import EXECUTORS

from prismserve.cli import main
from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime

TOKEN = "bench-token"


@pytest.fixture
def toy_gateway(serve_gateway):
    import httpx

    runtime = LocalRuntime(EXECUTORS)
    with serve_gateway(create_gateway(runtime, admin_token=TOKEN)) as url:
        response = httpx.post(
            f"{url}/admin/apps",
            json={"name": "omni", "source": APP_PATH.read_text()},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert response.status_code == 201, response.text
        yield url


def test_bench_runs_a_servegen_workload_and_writes_json_and_a_plot(toy_gateway, tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(
        [
            "bench",
            "--url",
            toy_gateway,
            "--model",
            "omni",
            "--workload",
            "servegen",
            "--requests",
            "16",
            "--rate",
            "40",
            "--warmup",
            "2",
            "--slo-ttft",
            "30",
            "--out",
            str(out),
            "--plot-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    summary = data["summary"]
    assert summary["requests"] == 14 and summary["completed"] == 14 and summary["failed"] == 0
    assert summary["throughput_rps"] > 0 and "image+text" in summary["by_type"]
    assert summary["ttft_s"]["p50"] is not None and summary["slo_attainment"] == 1.0
    # The toy LLM streams one token per prompt word (up to max_tokens): every request saw SSE events.
    assert all(r["token_s"] for r in data["requests"]) and any(
        len(r["token_s"]) > 1 for r in data["requests"]
    )
    assert (tmp_path / "latency_cdf.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "throughput" in printed and "image+text" in printed


def test_bench_reports_failed_requests_and_exits_nonzero(toy_gateway, capsys):
    code = main(
        [
            "bench",
            "--url",
            toy_gateway,
            "--model",
            "nope",
            "--workload",
            "azure-conv",
            "--requests",
            "3",
            "--rate",
            "50",
            "--quiet",
        ]
    )
    assert code == 1
    printed = capsys.readouterr().out
    assert "failed 3" in printed and "no app named 'nope'" in printed


def test_bench_rejects_bad_workload_options(capsys):
    assert (
        main(
            [
                "bench",
                "--model",
                "m",
                "--workload",
                "controlled",
                "--requests",
                "3",
                "--rate",
                "1",
                "--resolution",
                "big",
            ]
        )
        == 2
    )
    assert "--resolution must look like 1920x1080" in capsys.readouterr().err
    assert main(["bench", "--model", "m", "--requests", "3"]) == 2
    assert "poisson arrivals need a rate" in capsys.readouterr().err
