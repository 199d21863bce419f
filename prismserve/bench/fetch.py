"""Fetching the workloads folder from the manifest: upstream URLs or a mirror, every file checked by sha256.

A file is written under a `.part` name and renamed into place only when its hash matches, so a
folder never holds a wrong file under its real name; a file already there with the right hash is
kept. The package's notes (README.md among them, the mark `workloads_dir` looks for) are always
written, whatever `only` says.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prismserve.bench.manifest import WorkloadFile, groups, load_manifest
from prismserve.errors import WorkloadError

if TYPE_CHECKING:
    import httpx

CHUNK = 1 << 16


@dataclass
class FetchCount:
    """What a fetch did: files written and files already there with the right hash."""

    fetched: int = 0
    present: int = 0


def fetch_workloads(
    dest: Path,
    source: str | None = None,
    only: set[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> FetchCount:
    """Make `dest` hold the manifest's files (those of the `only` groups, and the notes).

    `source` is a mirror with the same layout: an http(s) base URL or a local folder; None fetches
    each data file from its upstream URL.
    """
    unknown = sorted((only or set()) - set(groups()))
    if unknown:
        raise WorkloadError(f"unknown workload groups {unknown}; choose from {', '.join(groups())}")
    if source and not _is_url(source) and not Path(source).is_dir():
        raise WorkloadError(f"--from {source}: not an http(s) URL nor a folder")
    files = [f for f in load_manifest() if f.url is None or only is None or f.group in only]
    count = FetchCount()
    with _Opener(source) as opener:
        for index, entry in enumerate(files, 1):
            target = dest / entry.path
            if _hash_of(target) == entry.sha256:
                count.present += 1
                state = "present"
            else:
                origin, chunks = opener.open(entry)
                _write_checked(chunks, target, entry, origin)
                count.fetched += 1
                state = "fetched"
            if progress:
                progress(f"[{index}/{len(files)}] {entry.path}  {entry.size / 1e3:,.0f} kB  {state}")
    return count


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _hash_of(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _write_checked(chunks: Iterator[bytes], target: Path, entry: WorkloadFile, origin: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with part.open("wb") as f:
            for block in chunks:
                digest.update(block)
                f.write(block)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != entry.sha256:
        part.unlink()
        raise WorkloadError(
            f"{entry.path}: sha256 {digest.hexdigest()} from {origin} is not the manifest's {entry.sha256}; "
            "the file was not kept (a changed upstream or a wrong mirror: fetch with --from a good copy)"
        )
    os.replace(part, target)


class _Opener:
    """Opens a manifest entry's bytes: the package's copy of a note, else the mirror or the upstream URL."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.client: httpx.Client | None = None  # opened on the first download

    def __enter__(self) -> _Opener:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()

    def open(self, entry: WorkloadFile) -> tuple[str, Iterator[bytes]]:
        """Where the bytes come from (for messages) and the bytes, in chunks."""
        note = entry.packaged()
        if note is not None:
            return "the prismserve package", iter([note.read_bytes()])
        if self.source and not _is_url(self.source):
            path = Path(self.source) / entry.path
            if not path.is_file():
                raise WorkloadError(
                    f"--from {self.source}: no {entry.path} there (a mirror keeps the manifest's layout)"
                )
            return str(path), _read(path)
        url = f"{self.source.rstrip('/')}/{entry.path}" if self.source else entry.url
        assert url is not None  # a data file has an upstream URL
        return url, self._download(url)

    def _download(self, url: str) -> Iterator[bytes]:
        import httpx

        if self.client is None:
            self.client = httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0))
        try:
            with self.client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise WorkloadError(
                        f"GET {url}: HTTP {response.status_code} (if the file moved upstream, fetch with "
                        "--from a mirror)"
                    )
                yield from response.iter_bytes(CHUNK)
        except httpx.HTTPError as exc:
            raise WorkloadError(
                f"GET {url}: {exc or type(exc).__name__} (offline? fetch with --from a mirror or a copy)"
            ) from exc


def _read(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            yield block
