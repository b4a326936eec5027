"""The request bodies the gateway accepts, as pydantic models (the OpenAI API's shapes), and
the checks that turn them into Meshnet sampling parameters.

Unknown fields are ignored as OpenAI-compatible servers do, except the ones whose meaning the
gateway cannot honour (penalties, n > 1, echo, the deprecated functions, ...): those are refused
with a 400 that names the parameter, so a client never silently gets something other than it
asked for. Chat's tool fields (tools, tool_choice, parallel_tool_calls, response_format, tool
turns in messages) are checked by tool_request.py; completions still refuse them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from meshnet.gateway import tool_request
from meshnet.gateway.errors import ApiError, bad_request
from meshnet.gateway.tool_request import ToolRequest

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20
MAX_MESSAGES = 1024
MAX_TOKENS = 1 << 20  # max_tokens past this is a 400 (a route's own limit, if lower, answers 400 too)
MAX_CALLS_IN_MESSAGE = 64  # tool_calls of one assistant message
MAX_CALL_ID_CHARS = 256


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=False)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    arguments: str  # JSON text, as OpenAI sends it; its size counts towards the prompt's


class MessageToolCall(_Body):
    """A call an earlier assistant turn made (the client sends the conversation back)."""
    id: str = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = Field(None, max_length=64)
    tool_calls: Optional[list[MessageToolCall]] = Field(None, max_length=MAX_CALLS_IN_MESSAGE)
    tool_call_id: Optional[str] = Field(None, min_length=1, max_length=MAX_CALL_ID_CHARS)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = False


class _Common(_Body):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=0, le=(1 << 63) - 1)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: Optional[str] = None

    # Extra fields refused with a 400 when present and not empty (ChatRequest serves some).
    unsupported_fields: ClassVar[tuple[str, ...]] = ("tools", "functions", "logit_bias", "tool_choice", "function_call",
                                                     "response_format", "best_of", "suffix", "audio", "modalities",
                                                     "prediction")

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise bad_request(f"at most {MAX_STOP_STRINGS} stop sequences", "stop")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise bad_request(f"each stop sequence must have 1..{MAX_STOP_CHARS} characters", "stop")
        return tuple(stops)

    def check_common(self) -> None:
        if self.n != 1:
            raise bad_request("n must be 1: the gateway returns one choice per request", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise bad_request(f"{name} is not supported (only 0)", name)
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")
        extra = self.model_extra or {}
        for name in self.unsupported_fields:
            if extra.get(name) not in (None, [], {}):
                raise bad_request(f"{name} is not supported by this gateway", name)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Any = None  # checked by tool_request.checked (its 400s name "tools", not a pydantic path)
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    unsupported_fields: ClassVar[tuple[str, ...]] = ("functions", "logit_bias", "function_call", "best_of", "suffix",
                                                     "audio", "modalities", "prediction")
    _tools: Optional[ToolRequest] = PrivateAttr(None)

    def check_common(self) -> None:
        super().check_common()
        self._tools = tool_request.checked(_given(self.tools), _given(self.tool_choice), self.parallel_tool_calls)
        tool_request.check_response_format(_given(self.response_format))
        tool_request.check_messages(self.messages)

    @property
    def checked_tools(self) -> Optional[ToolRequest]:
        """The checked tools (None: none were given); set by check_common."""
        return self._tools

    def budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def alternatives(self) -> Optional[int]:
        """None: no logprobs; else how many alternatives per token."""
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int]]
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    echo: bool = False

    def budget(self, default: int) -> int:
        return self.max_tokens or default

    def alternatives(self) -> Optional[int]:
        if self.echo:
            raise bad_request("echo is not supported", "echo")
        return self.logprobs


def _given(value: Any) -> Any:
    """None for an absent or empty value (null, [] or {}): those were always accepted as absent."""
    return None if value is None or value == [] or value == {} else value


def parse(model: type[_Body], data: object) -> _Body:
    """`data` as `model`; a 400 naming the first bad parameter otherwise."""
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise ApiError(400, f"invalid parameter {param}: {first.get('msg')}", param=param,
                       code="invalid_request") from None
