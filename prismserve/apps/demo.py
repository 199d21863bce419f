"""The demo's app (`prismserve demo`, `benchmarks/bench_omni.py`): the Omni app (`prismserve.apps.omni`)
on a tiny checkpoint, speaking short answers."""

from __future__ import annotations

from typing import Any, Literal

from prismserve.app.settings import app_module_source
from prismserve.apps.default import WRITTEN
from prismserve.apps.settings import OmniAppSettings

OMNI_APP = "prismserve.apps.omni"
DOC = "The prismserve demo: a tiny random-weight Omni model served split (or whole, with monolith)."


def demo_app_source(
    model: str,
    *,
    monolith: bool = False,
    max_codes: int = 50,
    engine: Literal["transformers", "vllm"] = "transformers",
    vllm: dict[str, Any] | None = None,
) -> str:
    """The demo's Omni app on `model` (`max_codes` 50: one second of speech per spoken answer)."""
    settings = OmniAppSettings(
        model=model, monolith=monolith, max_codes=max_codes, engine=engine, vllm=vllm or {}
    )
    return app_module_source(OMNI_APP, settings, doc=f"{DOC}\n\n{WRITTEN.format(module=OMNI_APP)}")
