"""Stage-level batching budgets (TriInfer, 004 Algorithm 1), measured on the deployments' real executors.

Each deployment gets the most work one batch may hold and still finish within its latency limit:
α·TTFT (α = 0.5: a request needs at least two batches, encode then prefill, before its first token)
for deployments that only encode or prefill (E, EP, P), the TBT for those that decode (D, PD, ED,
EPD, an unsplit LLM), whose every step delays each running reply's next token. Batch latency grows
with the batch (004 Figure 3), so the budget is found by binary search on measured latencies: an
image budget (encoder items per batch: an encoder's batcher limit, `EncoderSettings.max_batch`) and
a token budget (tokens per engine step: vLLM's `max_num_batched_tokens` with chunked prefill,
`VLLMEngineSettings.token_budget`). vLLM 0.32 takes no encoder budget of its own (its
`max_num_encoder_input_tokens` and `encoder_cache_size` follow `max_num_batched_tokens`), so an
engine that runs its own encoders (EPD) gets only the token budget.

`prismserve profile` writes the budgets beside the spec (`budgets_path`); `prismserve serve
--budgets FILE` deploys the app with them (`apply_budgets`).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prismserve.app import App
from prismserve.errors import InvalidRequestError
from prismserve.task import Stream, Task, UnitTask
from prismserve.task.components import (
    DecodeInput,
    EncoderSettings,
    Handoff,
    LLMInput,
    MediaItem,
    VLLMEngineSettings,
)

ALPHA = 0.5  # TriInfer's: the share of the TTFT one batch of an encode or prefill deployment may take
BEFORE_FIRST_TOKEN = frozenset({"E", "EP", "P"})  # limited by α·TTFT
DECODING = frozenset({"D", "PD", "ED", "EPD"})  # limited by the TBT
TOKEN_STEP = 32  # token budgets in whole KV blocks of a CPU engine (and of most GPU ones)

Measure = Callable[[int], Awaitable[float]]


class Budget(BaseModel):
    """One deployment's budget: `value` images or tokens per batch, its role and latency limit, and
    the batch latency measured there (`within_limit`: False when even the smallest batch took longer,
    so `value` is the smallest batch, not one that meets the SLO)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: str
    kind: Literal["images", "tokens"]
    value: int = Field(ge=1)
    limit_s: float = Field(gt=0)
    latency_s: float = Field(ge=0)
    within_limit: bool


class Budgets(BaseModel):
    """The budgets of an app's deployments, by deployment path, and the SLO they were searched for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float | None = None
    tbt_s: float | None = None
    alpha: float = ALPHA
    deployments: dict[str, Budget] = Field(default_factory=dict)


def latency_limit(role: str, ttft_s: float | None, tbt_s: float | None, alpha: float = ALPHA) -> float | None:
    """The longest a batch of a deployment in `role` may take (Algorithm 1, lines 1-4); None when the
    SLO sets no target that bounds it."""
    if role in BEFORE_FIRST_TOKEN:
        return None if ttft_s is None else alpha * ttft_s
    if role in DECODING:
        return tbt_s
    raise ValueError(f"unknown role {role!r}: one of {sorted(BEFORE_FIRST_TOKEN | DECODING)}")


async def search_budget(
    measure: Measure, limit_s: float, high: int, step: int = 1
) -> tuple[int, float, bool]:
    """The largest batch of a multiple of `step` (at most `high`) whose measured latency is within
    `limit_s`, by binary search (latency grows with the batch): the batch, its latency, and whether
    it is within the limit (False: even `step` took longer; `step` is returned)."""
    if high < step:
        raise ValueError(f"the largest batch ({high}) is below the step ({step})")
    low_latency = await measure(step)
    if low_latency > limit_s:
        return step, low_latency, False
    good, good_latency = 1, low_latency  # in steps
    top = high // step
    bad = top + 1
    while bad - good > 1:
        middle = (good + bad) // 2
        latency = await measure(middle * step)
        if latency <= limit_s:
            good, good_latency = middle, latency
        else:
            bad = middle
    return good * step, good_latency, True


def role_of(task: UnitTask[Any, Any]) -> str | None:
    """The TriInfer role a unit task plays (E, P, D, PD, EPD), None when it has no budget to set
    (an executor whose batch is not settable: transformers LLMs, talkers, generators)."""
    if isinstance(task, EncoderSettings):
        return "E"
    if not isinstance(task, VLLMEngineSettings):
        return None
    takes = type(task).input_type
    if isinstance(takes, type) and issubclass(takes, DecodeInput):
        return "D"
    if type(task).output_type is Handoff:
        return "EP" if task.with_encoders else "P"
    return "EPD" if task.with_encoders else "PD"


def strictest_slo(app: App) -> tuple[float | None, float | None]:
    """The tightest TTFT (for a prompt of no tokens) and TBT among the app's SLOs: budgets hold for
    every request type."""
    ttfts = [s.ttft_s for s in app.slos.values() if s.ttft_s is not None]
    tbts = [s.tbt_s for s in app.slos.values() if s.tbt_s is not None]
    return (min(ttfts) if ttfts else None), (min(tbts) if tbts else None)


async def measure_budgets(
    invoke: Callable[[UnitTask[Any, Any], Any], Awaitable[Any]],
    app: App,
    image: bytes,
    repeats: int = 3,
    max_tokens: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Budgets:
    """Every budget of `app`'s deployments that its SLOs bound, measured through `invoke(task, input)`
    (a call served to its end): median batch latencies of `repeats` tries per point searched. An
    encoder's image budget is searched up to its `max_batch`, a vLLM engine's token budget up to the
    step its engine runs now (`engine_step`: a longer prompt would take several steps, not one) and
    its context less room for the chat template (`max_tokens` caps it too). `clock` reads the time
    (tests give one their calls advance)."""
    ttft_s, tbt_s = strictest_slo(app)
    timing = Timing(repeats, clock)
    found: dict[str, Budget] = {}
    kind: Literal["images", "tokens"]
    for path, task in app.named_unit_tasks().items():
        role = role_of(task)
        limit = None if role is None else latency_limit(role, ttft_s, tbt_s)
        if role is None or limit is None or getattr(task, "modality", "image") != "image":
            continue  # no budget to set, none the SLOs bound, or an audio or video encoder (images only)
        if isinstance(task, EncoderSettings):
            measure, kind, high, step = _images(invoke, task, image, timing), "images", task.max_batch, 1
        else:
            assert isinstance(task, VLLMEngineSettings)  # role_of gives no other a role
            measure, kind, step = _tokens(invoke, task, timing), "tokens", TOKEN_STEP
            high = min(task.max_model_len - 8, engine_step(task), max_tokens or task.max_model_len)
        value, latency, within = await search_budget(measure, limit, high, step)
        found[path] = Budget(
            role=role, kind=kind, value=value, limit_s=limit, latency_s=latency, within_limit=within
        )
    return Budgets(ttft_s=ttft_s, tbt_s=tbt_s, deployments=found)


# vLLM 0.32's tokens per step when nothing sets them (`SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS`).
VLLM_DEFAULT_STEP = 2048


def engine_step(task: VLLMEngineSettings) -> int:
    """The most tokens one step of the task's engine computes as it runs now: its token budget, its
    `engine_args`' `max_num_batched_tokens`, else vLLM's default."""
    chosen = task.engine_args.get("max_num_batched_tokens", task.token_budget)
    return int(chosen) if chosen else VLLM_DEFAULT_STEP


class Timing:
    """How a batch latency is measured: the median of `repeats` runs (noisy machines: medians, never
    one run), timed by `clock`."""

    def __init__(self, repeats: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.repeats, self.clock = max(1, repeats), clock

    async def median(self, call: Callable[[], Awaitable[Any]]) -> float:
        """The median time `call` takes."""
        times = []
        for _ in range(self.repeats):
            started = self.clock()
            await call()
            times.append(self.clock() - started)
        return statistics.median(times)


def _images(
    invoke: Callable[[UnitTask[Any, Any], Any], Awaitable[Any]], task: Any, image: bytes, timing: Timing
) -> Measure:
    """An encoder's batch latency for `n` images: `n` concurrent calls, which its batcher serves as one batch."""

    async def measure(n: int) -> float:
        item = MediaItem(modality=task.modality, data=image)
        return await timing.median(lambda: asyncio.gather(*(invoke(task, item) for _ in range(n))))

    return measure


def _tokens(
    invoke: Callable[[UnitTask[Any, Any], Any], Awaitable[Any]], task: Any, timing: Timing
) -> Measure:
    """A vLLM engine's step latency for `n` tokens: a prompt of `n` tokens and one token out, one
    engine step (the prompt as the model's tokenizer counts it with the chat template). Every prompt
    starts with a number of its own, so vLLM's prefix cache computes none of it ahead."""
    words = _word_counter(task.model)
    tags = itertools.count()

    def request(n: int) -> LLMInput:
        text = _text(words(n), next(tags))
        conversation = [{"role": "user", "content": [{"type": "text", "text": text}]}]
        if role_of(task) == "D":  # decode given a first token and no hand-off: it computes the prompt
            return DecodeInput(
                conversation=conversation, max_tokens=2, handoff=Handoff(token=0, prompt_tokens=n)
            )
        return LLMInput(conversation=conversation, max_tokens=1)

    async def measure(n: int) -> float:
        return await timing.median(lambda: invoke(task, request(n)))

    return measure


def _text(words: int, tag: int = 0) -> str:
    """A prompt of `words` words after the number `tag` (six digits: prompts of one length are alike long)."""
    return " ".join([f"{tag % 1_000_000:06d}", *["hello"] * words])


def _word_counter(model: str) -> Callable[[int], int]:
    """Words of `_text` whose chat-templated prompt has about `n` tokens, from the model's tokenizer
    (two prompts measured: the template's tokens and the tokens per word)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    def count(words: int) -> int:
        conversation: Any = [{"role": "user", "content": [{"type": "text", "text": _text(words)}]}]
        ids: Any = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a BatchEncoding

    base, per_word = count(0), (count(256) - count(0)) / 256
    return lambda n: max(1, round((n - base) / per_word))


async def served(runtime: Any, app: App) -> Callable[[UnitTask[Any, Any], Any], Awaitable[Any]]:
    """`invoke(task, input)` on `runtime`'s replicas of `app`, served to its end: a stream, or each
    stream of an output (a thinker's text and talker streams), read to its last item."""

    async def invoke(task: UnitTask[Any, Any], value: Any) -> Any:
        async with runtime.request(app.name):
            out = await task(value)
            streams = (
                [out] if isinstance(out, Stream) else [v for v in vars(out).values() if isinstance(v, Stream)]
            )
            for stream in streams:
                await stream.collect()
            return out

    return invoke


def budgets_path(profile: Path) -> Path:
    """Where the budgets of the profile at `profile` are kept: beside it."""
    return profile.with_name(profile.stem + ".budgets.yaml")


def budgets_document(budgets: Budgets, about: dict[str, Any]) -> str:
    """The budgets as YAML, with a comment saying where they come from."""
    import yaml

    header = "".join(f"# {key}: {value}\n" for key, value in about.items())
    return header + yaml.safe_dump(budgets.model_dump(), sort_keys=False)


def load_budgets(path: Path) -> Budgets:
    """The budgets in the file at `path` (`prismserve profile` writes it beside the spec)."""
    import yaml

    try:
        return Budgets.model_validate(yaml.safe_load(path.read_text()))
    except OSError as exc:
        raise InvalidRequestError(f"cannot read budgets {path}: {exc.strerror or exc}") from None
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidRequestError(
            f"{path} holds no budgets ({' '.join(str(exc).split())[:200]}): give the .budgets.yaml "
            "file `prismserve profile` wrote"
        ) from None


def budget_field(task: UnitTask[Any, Any], budget: Budget) -> str:
    """The setting of `task` a budget sets: an encoder's batcher limit, a vLLM engine's token budget."""
    field = "max_batch" if budget.kind == "images" else "token_budget"
    if field not in type(task).model_fields:
        raise InvalidRequestError(
            f"a {budget.kind} budget does not fit {type(task).__name__} (it has no {field}): "
            "profile the app again"
        )
    return field


def apply_budgets(app: App, budgets: Budgets) -> None:
    """Set each budgeted deployment's setting in `app`, before the app is registered (its deployment
    keys are read then). Every unit task of that deployment is changed in place, wherever the app
    holds it (its composites, the module's names that serve() calls), so the app stays one object."""
    named = app.named_unit_tasks()
    unknown = sorted(set(budgets.deployments) - set(named))
    if unknown:
        raise InvalidRequestError(
            f"budgets name deployments {unknown} that app {app.name!r} does not have "
            f"(it has {sorted(named)}): profile the app again"
        )
    chosen = {named[path].deployment_key(): budget for path, budget in budgets.deployments.items()}
    for task in _unit_tasks(list(app.tasks.values())):
        found = chosen.get(task.deployment_key())
        if found is not None:
            task.__dict__[budget_field(task, found)] = found.value  # a frozen model, set before it is keyed
            task._key = None  # the deployment key is computed again, with the budget


def _unit_tasks(tasks: list[Task[Any, Any]]) -> list[UnitTask[Any, Any]]:
    """Every unit task object reachable from `tasks` (equivalent ones each, unlike named_unit_tasks)."""
    found: dict[int, UnitTask[Any, Any]] = {}
    stack = list(tasks)
    while stack:
        task = stack.pop()
        if isinstance(task, UnitTask):
            found.setdefault(id(task), task)
        else:
            stack.extend(task.subtasks())
    return list(found.values())
