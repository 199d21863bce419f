"""Built-in tasks: unit tasks of real models and the composites every app can use."""

from prismserve.tasklib.media_tokens import MediaTokens
from prismserve.tasklib.mllm import MLLMTask, TextOutput, conversation, reply_text
from prismserve.tasklib.omni import OmniOutput, OmniTask, chat_chunks
from prismserve.tasklib.router import Router
from prismserve.tasklib.units import EncodedMedia, EncoderOutput, EncoderTask, LLMInput, LLMTask, MediaItem

__all__ = [
    "EncodedMedia",
    "EncoderOutput",
    "EncoderTask",
    "LLMInput",
    "LLMTask",
    "MLLMTask",
    "MediaItem",
    "MediaTokens",
    "OmniOutput",
    "OmniTask",
    "Router",
    "TextOutput",
    "chat_chunks",
    "conversation",
    "reply_text",
]
