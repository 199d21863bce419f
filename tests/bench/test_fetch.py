"""`prismserve workloads fetch`: the manifest matches the shared folder, a fetch over HTTP or from a
folder rebuilds it byte for byte, a wrong file is refused and not kept, a second fetch skips."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from prismserve.bench import workloads
from prismserve.bench.manifest import describe, load_manifest
from prismserve.bench.workloads import WorkloadError, azure, workloads_dir
from prismserve.cli import main

SHARED = workloads_dir()  # the project's copy (tests/conftest.py finds it wherever the checkout is)
SMALL = "azure,media"  # ~2 MB of the 8: enough to exercise every path, fast


@contextlib.contextmanager
def _serve(folder: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep the test output clean
        pass


@pytest.fixture
def mirror() -> Iterator[str]:
    with _serve(SHARED) as url:
        yield url


@pytest.fixture
def no_shared_folder(tmp_path, monkeypatch) -> Path:
    """A machine with only a clone: no $PRISMSERVE_WORKLOADS, no shared/ above the cwd or the
    package, a home of its own. Returns that home's default fetch folder."""
    monkeypatch.delenv("PRISMSERVE_WORKLOADS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(workloads, "__file__", str(tmp_path / "pkg" / "workloads.py"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home" / ".cache" / "prismserve" / "workloads"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_manifest_describes_every_file_of_the_shared_folder():
    assert describe(SHARED) == list(load_manifest())
    notes = [f.path for f in load_manifest() if f.url is None]
    assert "README.md" in notes and "servegen/LICENSE" in notes
    assert all(f.url.startswith("https://raw.githubusercontent.com/") for f in load_manifest() if f.url)


def test_fetch_over_http_is_found_by_workloads_dir_and_a_second_fetch_skips(mirror, no_shared_folder, capsys):
    with pytest.raises(WorkloadError, match="prismserve workloads fetch"):
        workloads_dir()
    assert main(["workloads", "fetch", "--from", mirror, "--only", SMALL]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(no_shared_folder)
    assert "azure_llm_2023/AzureLLMInferenceTrace_conv.csv" in err and "fetched" in err
    fetched = [f for f in load_manifest() if f.url is None or f.group in SMALL.split(",")]
    for entry in fetched:
        assert _sha(no_shared_folder / entry.path) == entry.sha256
    assert not (no_shared_folder / "mooncake" / "conversation_trace.jsonl").exists()
    assert not list(no_shared_folder.rglob("*.part"))

    assert workloads_dir() == no_shared_folder
    assert len(azure("conv", workloads.Arrivals("trace"), count=10)) == 10
    with pytest.raises(WorkloadError, match="mooncake.*prismserve workloads fetch"):
        workloads.mooncake("synthetic", workloads.Arrivals("trace"), count=10)

    assert main(["workloads", "fetch", "--from", mirror, "--only", SMALL]) == 0
    assert f"0 fetched, {len(fetched)} already present" in capsys.readouterr().err


def test_a_file_with_the_wrong_hash_is_refused_and_not_kept(tmp_path, capsys):
    bad = tmp_path / "mirror"
    for entry in load_manifest():
        if entry.group == "media" and entry.url:
            (bad / entry.path).parent.mkdir(parents=True, exist_ok=True)
            (bad / entry.path).write_bytes((SHARED / entry.path).read_bytes())
    (bad / "media" / "cough.wav").write_bytes(b"not the cough")
    dest = tmp_path / "dest"
    with _serve(bad) as url:
        code = main(["workloads", "fetch", "--from", url, "--dir", str(dest), "--only", "media"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    expected = next(f.sha256 for f in load_manifest() if f.path == "media/cough.wav")
    assert err.startswith("error: media/cough.wav: sha256 ")
    assert hashlib.sha256(b"not the cough").hexdigest() in err and expected in err
    assert not (dest / "media" / "cough.wav").exists()
    assert not (dest / "media" / "cough.wav.part").exists()


def test_fetch_from_a_local_folder_replaces_a_wrong_file(tmp_path, capsys):
    dest = tmp_path / "dest"
    (dest / "media").mkdir(parents=True)
    (dest / "media" / "cars.jpg").write_bytes(b"stale")
    args = ["workloads", "fetch", "--from", str(SHARED), "--dir", str(dest), "--only", "media", "--quiet"]
    assert main(args) == 0
    for entry in load_manifest():
        if entry.group == "media" or entry.url is None:
            assert _sha(dest / entry.path) == entry.sha256, entry.path


def test_fetch_errors_are_one_line_and_exit_2(tmp_path, capsys):
    dest = ["--dir", str(tmp_path / "dest")]
    assert main(["workloads", "fetch", *dest, "--only", "servegen,videos"]) == 2
    assert capsys.readouterr().err == (
        "error: unknown workload groups ['videos']; choose from azure, media, mooncake, servegen\n"
    )
    assert main(["workloads", "fetch", *dest, "--from", str(tmp_path / "nowhere")]) == 2
    assert "not an http(s) URL nor a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["workloads", "fetch", *dest, "--from", str(tmp_path / "empty"), "--only", "media"]) == 2
    assert "no media/cars.jpg there" in capsys.readouterr().err
    with _serve(tmp_path / "empty") as url:
        assert main(["workloads", "fetch", *dest, "--from", url, "--only", "media", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTTP 404" in err and "/media/cars.jpg" in err
