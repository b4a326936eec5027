"""The tool fields of a chat request (issue 33), checked before anything is rendered or compiled:
`tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, and the tool turns of the
conversation (`role: "tool"` messages, assistant messages with `tool_calls`).

Bounds (every one a 400 naming the field, before a template sees the tools): at most MAX_TOOLS
tools; names are OpenAI's (`^[a-zA-Z0-9_-]{1,64}$`) and unique; a description is a string of at
most MAX_DESCRIPTION_CHARS; `parameters` is a JSON object nested at most MAX_SCHEMA_DEPTH deep
(measured iteratively, before anything recursive touches it) and at most MAX_SCHEMA_BYTES as
compact UTF-8 JSON.

Constrained sampling (constrained.py) enforces `tool_choice` "required" or a named function
(calls only, arguments valid against the parameters), and `response_format` json_object and
json_schema. `strict: true` functions are accepted where calls are enforced ("required", named);
under "auto" the model may answer in text, where nothing enforces the arguments, so strict is
refused there rather than pretended.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional, Sequence

from meshnet.gateway.errors import bad_request

MAX_TOOLS = 64
MAX_SCHEMA_DEPTH = 16  # the parameters object itself is depth 1
MAX_SCHEMA_BYTES = 64 << 10
MAX_DESCRIPTION_CHARS = 8 << 10
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's, matched whole
CHOICES = ("none", "auto", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: no parameters is an empty list


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """A request's checked tools. `tools`: the {"type": "function", "function": {name,
    description?, parameters}} objects a chat template gets (as transformers passes them), in the
    request's order, parameters filled in as an empty object schema when omitted. `choice` is
    "auto", "none", "required" or "named" (`named` is then the function's name); `parallel`:
    several calls per answer."""

    tools: tuple[dict, ...]
    choice: str
    parallel: bool
    named: Optional[str] = None

    @property
    def forced(self) -> bool:
        """Whether the answer must be tool calls (constrained sampling enforces them)."""
        return self.choice in ("required", "named")

    @property
    def names(self) -> frozenset[str]:
        return frozenset(tool["function"]["name"] for tool in self.tools)

    @property
    def active(self) -> bool:
        """Whether the model may call tools (tool_choice "none" renders and answers as without tools)."""
        return self.choice != "none"

    def chars(self) -> int:
        """The tools' size as JSON text: part of the prompt's measured size when they are active."""
        return len(json.dumps(self.tools, ensure_ascii=False)) if self.active else 0


def checked(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> Optional[ToolRequest]:
    """The request's tools, or None when it has none (absent, null or an empty list, as before
    tools were served: the caller passes None for null, [] and {}); a 400 naming the field
    otherwise. parallel_tool_calls is ignored without tools, as it always was."""
    if tools is None:
        if tool_choice is not None:
            raise bad_request("tool_choice is only allowed when tools are given", "tool_choice")
        return None
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise bad_request("parallel_tool_calls must be true or false", "parallel_tool_calls")
    offered = _checked_tools(tools)
    names = [tool["function"]["name"] for tool in offered]
    choice, named = ("auto", None) if tool_choice is None else _checked_choice(tool_choice, names)
    request = ToolRequest(tuple({"type": "function", "function": {k: v for k, v in tool["function"].items()
                                                                  if k != "strict"}} for tool in offered),
                          choice, parallel_tool_calls is not False, named)
    strict = [n for n, tool in enumerate(offered) if tool["function"].get("strict")]
    if strict and choice == "auto":
        raise bad_request(f'tools[{strict[0]}].function.strict: true is enforced with tool_choice "required" or a '
                          'named function; with "auto" the model may answer in text and its arguments are not '
                          "constrained, so set tool_choice or leave strict out", "tools")
    return request


def check_response_format(value: Any) -> None:
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name",
    "schema"?, "strict"?, "description"?}}, the schema a JSON object within the tools' bounds; a
    400 naming the field otherwise. The schema is converted later (constrained.py)."""
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object"):
        return
    if kind != "json_schema":
        raise bad_request('response_format must be {"type": "text"}, {"type": "json_object"} or {"type": '
                          '"json_schema", "json_schema": {...}}', "response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("response_format.json_schema must be an object with a name and a schema", "response_format")
    name = spec.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad_request("response_format.json_schema.name must match ^[a-zA-Z0-9_-]{1,64}$", "response_format")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad_request("response_format.json_schema.strict must be true or false", "response_format")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise bad_request("response_format.json_schema.schema must be a JSON object (a JSON schema)", "response_format")
    if depth_exceeds(schema, MAX_SCHEMA_DEPTH):
        raise bad_request(f"response_format.json_schema.schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
                          "response_format")
    if len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode()) > MAX_SCHEMA_BYTES:
        raise bad_request(f"response_format.json_schema.schema is over {MAX_SCHEMA_BYTES} bytes as JSON",
                          "response_format")


def check_messages(messages: Sequence[Any]) -> None:
    """The tool turns of a conversation (pydantic ChatMessage objects, shapes already checked):
    only assistants carry tool_calls, only tool messages a tool_call_id, and each tool message
    has content and answers a call of an earlier assistant message."""
    called: set[str] = set()
    for n, message in enumerate(messages):
        where = f"messages[{n}]"
        if message.tool_calls and message.role != "assistant":
            raise bad_request(f"{where}: only assistant messages have tool_calls", f"messages.{n}.tool_calls")
        if message.tool_call_id is not None and message.role != "tool":
            raise bad_request(f"{where}: only tool messages have a tool_call_id", f"messages.{n}.tool_call_id")
        if message.role == "assistant":
            called.update(call.id for call in message.tool_calls or ())
        if message.role != "tool":
            continue
        if message.tool_call_id is None:
            raise bad_request(f"{where}: a tool message needs the tool_call_id of the call it answers",
                              f"messages.{n}.tool_call_id")
        if message.tool_call_id not in called:
            raise bad_request(f"{where}.tool_call_id {_short(message.tool_call_id)} answers no tool call of an "
                              "earlier assistant message", f"messages.{n}.tool_call_id")
        if message.content is None:
            raise bad_request(f"{where}: a tool message needs content (the call's result)", f"messages.{n}.content")


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests objects and arrays more than `limit` deep (a top-level object
    or array is depth 1). Iterative, and it stops at the first node past `limit`."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def template_arguments(arguments: str) -> Any:
    """A call's arguments as chat templates want them (Qwen, Hermes and Llama 3 templates write
    them with `tojson`): the JSON object the string holds when it holds one no deeper than
    MAX_SCHEMA_DEPTH, else the string unchanged."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if isinstance(parsed, dict) and not depth_exceeds(parsed, MAX_SCHEMA_DEPTH):
        return parsed
    return arguments


def _checked_tools(tools: Any) -> tuple[dict, ...]:
    if not isinstance(tools, list):
        raise bad_request('tools must be a list of {"type": "function", "function": {...}} objects', "tools")
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools (got {len(tools)})", "tools")
    seen: dict[str, int] = {}
    out = []
    for n, tool in enumerate(tools):
        where = f"tools[{n}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f'{where}.type must be "function"', "tools")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object with a name", "tools")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(f"{where}.function.name must match ^[a-zA-Z0-9_-]{{1,64}}$", "tools")
        if name in seen:
            raise bad_request(f"{where}.function.name {name!r} is also the name of tools[{seen[name]}]", "tools")
        seen[name] = n
        out.append({"type": "function", "function": _checked_function(function, where)})
    return tuple(out)


def _checked_function(function: dict, where: str) -> dict:
    out = {"name": function["name"]}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise bad_request(f"{where}.function.description must be a string of at most {MAX_DESCRIPTION_CHARS} "
                              "characters", "tools")
        out["description"] = description
    parameters = function.get("parameters")
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON object (a JSON schema)", "tools")
    if depth_exceeds(parameters, MAX_SCHEMA_DEPTH):
        raise bad_request(f"{where}.function.parameters nests deeper than {MAX_SCHEMA_DEPTH} levels", "tools")
    if len(json.dumps(parameters, ensure_ascii=False, separators=(",", ":")).encode()) > MAX_SCHEMA_BYTES:
        raise bad_request(f"{where}.function.parameters is over {MAX_SCHEMA_BYTES} bytes as JSON", "tools")
    out["parameters"] = parameters
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"{where}.function.strict must be true or false", "tools")
    if strict:
        out["strict"] = True  # taken out of what templates see by checked()
    return out


def _checked_choice(tool_choice: Any, names: list[str]) -> tuple[str, Optional[str]]:
    if isinstance(tool_choice, str) and tool_choice in CHOICES:
        return tool_choice, None
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                          '{"name": ...}}', "tool_choice")
    if name not in names:
        raise bad_request(f"tool_choice names function {_short(name)}, which is not in tools", "tool_choice")
    return "named", name


def _short(text: str) -> str:
    return repr(text if len(text) <= 64 else text[:64] + "...")
