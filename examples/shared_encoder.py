"""Two LLMs sharing one vision encoder (002 Listing 2): a base InternVL3 and a fine-tune of its LLM
answer every request side by side. Each image is encoded once, in one task graph, and both LLMs
read its embeddings; the encoder is one deployment serving both.

$PRISMSERVE_MODEL and $PRISMSERVE_MODEL_TUNED: the two checkpoints (same vision tower and projector;
tiny ones: `prismserve tiny internvl3 internvl3-tuned`).
"""

import os

from pydantic import BaseModel

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest, TextDelta
from prismserve.task import Stream, Task, TaskOutput
from prismserve.tasklib import EncoderTask, LLMTask, reply_text
from prismserve.tasklib.mllm import llm_input

BASE = os.environ.get("PRISMSERVE_MODEL", "OpenGVLab/InternVL3-8B-hf")
TUNED = os.environ.get("PRISMSERVE_MODEL_TUNED", BASE)


class TwoAnswers(TaskOutput):
    base: Stream[TextDelta]
    tuned: Stream[TextDelta]


class SharedEncoder(Task[ChatRequest, TwoAnswers]):
    """One image encoder, two LLMs."""

    base: str
    tuned: str

    def post_init(self) -> None:
        self.encoder = EncoderTask(model=self.base, modality="image")
        self.llms = {"base": LLMTask(model=self.base), "tuned": LLMTask(model=self.tuned)}

    def invoke(self, request: ChatRequest) -> TwoAnswers:
        prompt = llm_input(request, self.base, ("image",), {"image": self.encoder})
        return TwoAnswers(**{name: llm.invoke(prompt) for name, llm in self.llms.items()})


pair = SharedEncoder(base=BASE, tuned=TUNED)


class Config(AppConfig):
    tasks = {"pair": pair}
    input_modalities = frozenset({"text", "image"})


class Answers(BaseModel):
    """Each LLM's answer."""

    answers: dict[str, str]


async def serve(request: ChatRequest) -> Answers:
    out = await pair(request)
    return Answers(answers={"base": await reply_text(out.base), "tuned": await reply_text(out.tuned)})
