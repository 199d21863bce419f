"""Where a model comes from: a local checkpoint directory, or a hub id downloaded (or found in the
cache) with `huggingface_hub.snapshot_download`, so that replicas load a local path."""

from __future__ import annotations

from pathlib import Path

from prismserve.errors import UnknownModelError


class CheckpointError(UnknownModelError):
    """The model cannot be had: not a directory, not on the hub, gated, or offline and not cached."""


def local_checkpoint(model: str) -> Path | None:
    """`model` as a local checkpoint directory, or None when it is to be read as a hub id; a path
    that names no directory is a `CheckpointError`."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    if model.startswith(("/", "./", "../", "~")) or path.exists() or model.count("/") > 1:
        raise CheckpointError(f"{model}: no checkpoint directory there (a hub id is OWNER/NAME)")
    return None


def resolve_checkpoint(model: str, *, offline: bool = False) -> Path:
    """The local directory of `model`: a checkpoint directory as it is, a hub id's snapshot
    (downloaded with progress bars unless cached; HF_TOKEN, HF_HOME and HF_ENDPOINT as
    huggingface_hub reads them; `offline` or HF_HUB_OFFLINE: the cache only)."""
    local = local_checkpoint(model)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(model, local_files_only=offline))
    except GatedRepoError:
        raise CheckpointError(
            f"{model} is gated: accept its licence on the hub's model page, then set HF_TOKEN to a token "
            "of that account (or run `hf auth login`)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{model}: no such revision on the hub") from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{model}: no such model on the hub (or it is private: set HF_TOKEN to a token that can read it)"
        ) from None
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{model} is not in the hub cache ({_cache_dir()}) and the hub is not reachable or offline mode "
            "is on (HF_HUB_OFFLINE / --offline): download it once online, or serve a local directory"
        ) from None
    except HFValidationError as exc:
        raise CheckpointError(f"{model}: neither a local directory nor a hub id: {exc}") from None
    except (HfHubHTTPError, OSError) as exc:
        raise CheckpointError(f"{model}: download failed: {_first_line(exc)}") from None


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
