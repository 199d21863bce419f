"""Composite tasks used only by tests: nesting, loops, routing and misbehaving invoke()s."""

from __future__ import annotations

from itertools import count

from toy.tasks import ChatOutput, EncoderTask, LLMInput, LLMTask, MediaInput, MLLMTask

from prismserve.protocol.chat import ChatRequest
from prismserve.task import Task, TaskInput, TaskOutput, replayable_choice


class Pair(Task[ChatRequest, ChatOutput]):
    """Three levels deep: Pair -> MLLMTask -> unit tasks; two MLLMs share the same encoders."""

    def post_init(self) -> None:
        self.first = MLLMTask(model_id="shared")
        self.second = MLLMTask(model_id="shared")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        self.first.invoke(request)
        return self.second.invoke(request)


class Outer(Task[ChatRequest, ChatOutput]):
    """Another level on top of Pair."""

    def post_init(self) -> None:
        self.inner = Pair()

    def invoke(self, request: ChatRequest) -> ChatOutput:
        return self.inner.invoke(request)


class RefineRequest(TaskInput):
    """Encode one image `rounds` times, chaining each round's embeddings into the next prompt."""

    image: bytes
    rounds: int


class RefineResponse(TaskOutput):
    embeddings: list


class Refine(Task[RefineRequest, RefineResponse]):
    """A loop whose trip count comes from the request."""

    def post_init(self) -> None:
        self.encoder = EncoderTask(model_id="m", modality="image")
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: RefineRequest) -> RefineResponse:
        embeddings = []
        for _ in range(request.rounds):
            embeddings.append(self.encoder.invoke(MediaInput(modality="image", data=request.image)).embedding)
            self.llm.invoke(LLMInput(prompt="round", embeddings=list(embeddings)))
        return RefineResponse(embeddings=embeddings)


class Router(Task[ChatRequest, ChatOutput]):
    """Request-static routing over planned paths (000 Listing 2)."""

    paths: list[Task]
    text_only_probabilities: list[float]
    image_text_probabilities: list[float]

    def invoke(self, request: ChatRequest) -> ChatOutput:
        probs = self.image_text_probabilities if request.images else self.text_only_probabilities
        return self.paths[replayable_choice(len(self.paths), probs)].invoke(request)


class SideEffect(Task[ChatRequest, ChatOutput]):
    """Calls the encoder once more on every run: replay diverges from record."""

    def post_init(self) -> None:
        self.calls = count()
        self.encoder = EncoderTask(model_id="m", modality="image")
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        text = self.llm.invoke(LLMInput(prompt=request.prompt))
        for _ in range(next(self.calls) + 1):
            self.encoder.invoke(MediaInput(modality="image", data=b"x"))
        return ChatOutput(text=text)


class Flip(Task[ChatRequest, ChatOutput]):
    """Invokes a different unit task on replay than on record."""

    def post_init(self) -> None:
        self.calls = count()
        self.encoder = EncoderTask(model_id="m", modality="image")
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        if next(self.calls) == 0:
            self.encoder.invoke(MediaInput(modality="image", data=b"x"))
        return ChatOutput(text=self.llm.invoke(LLMInput(prompt=request.prompt)))


class PeekAtOutput(Task[ChatRequest, ChatOutput]):
    """Branches on a unit-task output: not possible during record."""

    def post_init(self) -> None:
        self.encoder = EncoderTask(model_id="m", modality="image")
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        embedding = self.encoder.invoke(MediaInput(modality="image", data=b"x")).embedding
        if embedding:
            pass
        return ChatOutput(text=self.llm.invoke(LLMInput(prompt=request.prompt)))


class FormatOutput(Task[ChatRequest, ChatOutput]):
    """Formats a unit-task output into a prompt: would silently record garbage if allowed."""

    def post_init(self) -> None:
        self.encoder = EncoderTask(model_id="m", modality="image")
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        embedding = self.encoder.invoke(MediaInput(modality="image", data=b"x")).embedding
        return ChatOutput(text=self.llm.invoke(LLMInput(prompt=f"{embedding}")))


COMPARISONS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "in": lambda a, b: b in a,
    "is in": lambda a, b: a in [b],
    "hash": lambda a, b: {a},
    "handles ==": lambda a, b: a == a,  # noqa: PLR0124 - two placeholders
}


class CompareOutput(Task[ChatRequest, ChatOutput]):
    """Compares a unit-task output (`of`: a data handle or a stream) with `op`: not possible during record."""

    op: str
    of: str = "embedding"

    def post_init(self) -> None:
        self.encoder = EncoderTask(model_id="m", modality="image")
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        embedding = self.encoder.invoke(MediaInput(modality="image", data=b"x")).embedding
        text = self.llm.invoke(LLMInput(prompt=request.prompt))
        if COMPARISONS[self.op](embedding if self.of == "embedding" else text, request.prompt):
            pass
        return ChatOutput(text=text)


class SwapOnReplay(Task[ChatRequest, ChatOutput]):
    """Same calls on replay, but the LLM gets its embeddings in the other order, or another prompt."""

    change: str = "producer"  # or "prompt"

    def post_init(self) -> None:
        self.calls = count()
        self.encoders = {"image": EncoderTask(model_id="m", modality="image")}
        self.llm = LLMTask(model_id="m")

    def invoke(self, request: ChatRequest) -> ChatOutput:
        first = self.encoders["image"].invoke(MediaInput(modality="image", data=b"1")).embedding
        second = self.encoders["image"].invoke(MediaInput(modality="image", data=b"2")).embedding
        replaying = next(self.calls) > 0
        embeddings = [second, first] if replaying and self.change == "producer" else [first, second]
        prompt = f"{request.prompt} again" if replaying and self.change == "prompt" else request.prompt
        return ChatOutput(text=self.llm.invoke(LLMInput(prompt=prompt, embeddings=embeddings)))


class Nest(Task[ChatRequest, ChatOutput]):
    """SwapOnReplay one level down, so that divergence errors must name the unit task by its path."""

    change: str = "producer"

    def post_init(self) -> None:
        self.thinker = SwapOnReplay(change=self.change)

    def invoke(self, request: ChatRequest) -> ChatOutput:
        return self.thinker.invoke(request)
