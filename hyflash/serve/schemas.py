"""OpenAI request bodies (pydantic models: FastAPI validates them) and OpenAI-style error objects.

Fields hyflash does not use (user, logprobs, ...) are ignored, as OpenAI-compatible servers do; the fields it
reads must have the right type and range, else the client gets a 400 naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hyflash.sampling import SamplingConfig


class APIError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class CompletionSettings(BaseModel):
    """What chat and text completions share: sampling, length, stop strings, streaming."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None  # None: the served model
    max_tokens: int | None = Field(default=None, ge=1)  # None: up to the model's context
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens
    temperature: float = Field(default=1.0, ge=0)  # OpenAI's default; 0 = greedy
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)  # an extension (llama.cpp, vLLM): 0 = off
    seed: int | None = None  # None: a fresh seed per request
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)  # one choice per request

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def for_template(self) -> dict:
        """The message as chat templates read it: plain text content; OpenAI's `developer` is the system role."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(CompletionSettings):
    messages: list[ChatMessage] = Field(min_length=1)

    @field_validator("messages")
    @classmethod
    def _some_text(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.for_template()["content"].strip() for m in messages):
            raise ValueError("every message is empty: give at least one some text")
        return messages


class CompletionRequest(CompletionSettings):
    prompt: str | list[int] | list[str]  # text, token ids, or a one-element list of text

    @field_validator("prompt")
    @classmethod
    def _one_nonempty_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ValueError("one prompt per request (this server does not batch)")
            prompt = prompt[0]
        if (isinstance(prompt, str) and not prompt.strip()) or not prompt:
            raise ValueError("the prompt is empty: give some text")
        return prompt
