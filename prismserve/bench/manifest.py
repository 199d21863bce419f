"""The workloads manifest: every file of the workloads folder with its size, sha256 and upstream URL.

`prismserve workloads fetch` rebuilds the folder from it on a machine that has only a clone. Data
files come from their upstream repositories (raw.githubusercontent.com on the default branch, as of
2026-11) or a mirror; the folder's own notes (READMEs, licences, the numbers read off plots) are not
upstream files and ship in the package, under `workload_notes/`.

Regenerate after the folder changes: `python3 -m prismserve.bench.manifest ../shared/workloads`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

MANIFEST = Path(__file__).with_name("workloads.json")
NOTES = "workload_notes"  # the package folder holding the non-upstream text files
AS_OF = "2026-11"

_RAW = "https://raw.githubusercontent.com"
# folder of the workloads tree -> (its group for --only, the upstream folder of its data files)
FOLDERS: dict[str, tuple[str, str | None]] = {
    "": ("notes", None),
    "servegen": ("servegen", None),
    "servegen/mm-image": ("servegen", f"{_RAW}/alibaba/ServeGen/main/data/multimodal/mm-image"),
    "azure_llm_2023": ("azure", f"{_RAW}/Azure/AzurePublicDataset/master/data"),
    "azure_lmm_2025": ("azure", None),
    "mooncake": ("mooncake", f"{_RAW}/kvcache-ai/Mooncake/main/FAST25-release/traces"),
    "media": ("media", f"{_RAW}/sgl-project/sglang-omni/main/tests/data"),
}
_NOTE_SUFFIXES = (".md", ".txt")  # and LICENSE files: the folder's own texts, not upstream files


@dataclass(frozen=True)
class WorkloadFile:
    """One file of the workloads folder: where it goes, what it must hash to, where it comes from
    (`url` None: a note shipped in the package, not an upstream file)."""

    path: str
    group: str
    size: int
    sha256: str
    url: str | None

    def packaged(self) -> Traversable | None:
        """The package's copy of a note; None for a data file."""
        if self.url is not None:
            return None
        return resources.files("prismserve.bench").joinpath(NOTES, *self.path.split("/"))


@cache
def load_manifest() -> tuple[WorkloadFile, ...]:
    """The files of the manifest that ships with the package, in path order."""
    data = json.loads(MANIFEST.read_text())
    return tuple(WorkloadFile(**entry) for entry in data["files"])


def groups() -> tuple[str, ...]:
    """The names `--only` accepts: the groups that have data files."""
    return tuple(sorted({f.group for f in load_manifest() if f.url is not None}))


def describe(folder: Path) -> list[WorkloadFile]:
    """The manifest entries of every file under `folder`, with URLs from `FOLDERS`."""
    entries = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        path = file.relative_to(folder).as_posix()
        group, url = _origin(path)
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        entries.append(WorkloadFile(path, group, file.stat().st_size, digest, url))
    return entries


def _origin(path: str) -> tuple[str, str | None]:
    folder, _, name = path.rpartition("/")
    if folder not in FOLDERS:
        raise ValueError(f"{path}: its folder is not in FOLDERS ({__file__}); add it with its upstream")
    group, base = FOLDERS[folder]
    if name.endswith(_NOTE_SUFFIXES) or name == "LICENSE":
        return group, None
    if base is None:
        raise ValueError(
            f"{path}: a data file in a folder without an upstream; give {folder!r} one in FOLDERS"
        )
    return group, f"{base}/{name}"


def write_manifest(folder: Path) -> int:
    """Write workloads.json for `folder` and copy its notes into the package; the number of files."""
    entries = describe(folder)
    notes = Path(__file__).with_name(NOTES)
    shutil.rmtree(notes, ignore_errors=True)
    for entry in entries:
        if entry.url is None:
            (notes / entry.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / entry.path, notes / entry.path)
    about = (
        f"The workloads folder's files and their upstreams as of {AS_OF}; url null: a note shipped in "
        f"prismserve/bench/{NOTES}. Regenerate: python3 -m prismserve.bench.manifest FOLDER"
    )
    rows = ",\n".join(f"  {json.dumps(asdict(e))}" for e in entries)  # one file a line: readable diffs
    MANIFEST.write_text(f'{{\n "about": {json.dumps(about)},\n "files": [\n{rows}\n ]\n}}\n')
    return len(entries)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python3 -m prismserve.bench.manifest WORKLOADS_FOLDER")
    print(f"{write_manifest(Path(sys.argv[1]))} files -> {MANIFEST}")
