"""Tools from MCP servers, as an environment: :class:`MCPEnvironment` (extra ``mcp``).

The environment connects to one or several Model Context Protocol servers, over stdio (a
subprocess it starts, :class:`StdioServer`) or streamable HTTP (:class:`HTTPServer`), lists
their tools in the same OpenAI-style schema as Python tools, and answers each
:class:`~tapekit.dialog.ToolCall` with the server's ``tools/call``. Servers are started when the
environment is entered (``async with`` or ``with``) and stopped when it is left.

Everything that can go wrong on the server's side becomes a :class:`~tapekit.dialog.ToolResult`
with ``error`` set, naming the server and the tool, so the agent sees it and the loop goes on:
a tool that reports ``isError``, a call that takes longer than ``timeout_s``, a server that
closed the connection or died.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Self, TextIO, TypeVar

from tapekit.core import Action, Tape
from tapekit.dialog import ToolCall, ToolResult
from tapekit.effects import EFFECTS, Effect, EffectInDoubt
from tapekit.effects import journal as current_journal
from tapekit.environment import ActionHandler, Tool, ToolEnvironment
from tapekit.errors import TapekitError

__all__ = [
    "HTTPServer",
    "InProcessServer",
    "MCPEnvironment",
    "MCPServerError",
    "MCPToolInfo",
    "ServerSpec",
    "StdioServer",
    "effect_of_annotations",
    "listed_names",
]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class MCPServerError(TapekitError, RuntimeError):
    """An MCP server could not be started, or its tools could not be listed (named in the message)."""


@dataclass(frozen=True)
class StdioServer:
    """An MCP server that the environment starts as a subprocess and talks to over stdin/stdout.

    ``name`` identifies the server in prefixes and error messages; ``env`` is added to the
    default environment of the process; ``stderr`` receives the server's log (default: ours).
    """

    name: str
    command: str
    args: Sequence[str] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    stderr: TextIO | None = None


@dataclass(frozen=True)
class HTTPServer:
    """An MCP server already running behind a streamable HTTP endpoint (``http://host:port/mcp``);
    ``headers`` are sent with every request (e.g. an ``Authorization`` header)."""

    name: str
    url: str
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class InProcessServer:
    """An MCP server object of the SDK (``MCPServer``) run in this process: for tests and
    demos, with no subprocess and no network."""

    name: str
    server: Any


ServerSpec = StdioServer | HTTPServer | InProcessServer


@dataclass(frozen=True)
class MCPToolInfo:
    """One tool as listed to the LLM: ``name`` (prefixed if it clashed), the ``server`` that
    has it, its ``tool`` name there, ``description`` and JSON ``input_schema``, and its
    ``effect`` (:mod:`tapekit.effects`) from the server's annotations (see
    :func:`effect_of_annotations`) or the environment's ``effects``."""

    name: str
    server: str
    tool: str
    description: str
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    effect: Effect = "once"

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema, like :meth:`tapekit.Tool.schema`."""
        parameters = json.loads(json.dumps(self.input_schema or {"type": "object", "properties": {}}))
        parameters.pop("title", None)
        for prop in parameters.get("properties", {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        function = {"name": self.name, "description": self.description, "parameters": parameters}
        return {"type": "function", "function": function}


def _check_specs(servers: Sequence[ServerSpec]) -> list[ServerSpec]:
    specs = list(servers)
    seen: set[str] = set()
    for spec in specs:
        if not isinstance(spec, StdioServer | HTTPServer | InProcessServer):
            raise TypeError(
                "an MCP server must be a StdioServer, HTTPServer or InProcessServer, "
                f"not {type(spec).__name__}"
            )
        if not _NAME.match(spec.name):
            raise ValueError(f"MCP server name {spec.name!r} must be 1-64 letters, digits, '_' or '-'")
        if spec.name in seen:
            raise ValueError(f"two MCP servers are named {spec.name!r}")
        seen.add(spec.name)
    return specs


def listed_names(
    tools: Sequence[tuple[str, str]], taken: Sequence[str] = (), prefix_all: bool = False
) -> list[str]:
    """The names under which ``(server, tool)`` pairs are offered to the LLM.

    A tool name that only one server offers (and no Python tool of the environment uses) is
    kept as it is; a name offered more than once becomes ``<server>__<tool>`` for every server
    that offers it (``prefix_all`` prefixes every tool). A clash that remains is an error.
    """
    counts: dict[str, int] = {}
    for name in [t for _, t in tools] + list(taken):
        counts[name] = counts.get(name, 0) + 1
    names = [f"{s}__{t}" if prefix_all or counts[t] > 1 else t for s, t in tools]
    clash = sorted({n for n in names if names.count(n) > 1 or n in taken})
    if clash:
        raise MCPServerError(f"MCP tool names still clash after prefixing with the server name: {clash}")
    return names


class _Connection:
    """One connected MCP client (used only on the environment's own event loop)."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.client: Any = None
        self.closed_reason: str | None = None

    def make_client(self) -> Any:
        from mcp import Client, StdioServerParameters

        spec = self.spec
        if isinstance(spec, StdioServer):
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(
                command=spec.command, args=list(spec.args), env=spec.env, cwd=spec.cwd
            )
            return Client(stdio_client(params, errlog=spec.stderr or sys.stderr))
        if isinstance(spec, HTTPServer):
            if not spec.headers:
                return Client(spec.url)
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            return Client(
                streamable_http_client(spec.url, http_client=httpx2.AsyncClient(headers=spec.headers))
            )
        return Client(spec.server)

    async def list_tools(self) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(1000):
            page = await self.client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise MCPServerError(f"MCP server {self.spec.name!r} lists more than 1000 pages of tools")


def effect_of_annotations(annotations: Any) -> Effect:
    """A tool's :mod:`~tapekit.effects` effect from its MCP annotations: ``readOnlyHint`` ->
    ``"read"``, ``idempotentHint`` -> ``"idempotent"``, else ``"once"`` (the MCP defaults: a
    tool that says nothing may write, and a repeated call may write again)."""
    if annotations is None:
        return "once"
    if getattr(annotations, "read_only_hint", None):
        return "read"
    if getattr(annotations, "idempotent_hint", None):
        return "idempotent"
    return "once"


def _description(text: str | None) -> str:
    return inspect.cleandoc(text or "")


def _result_content(result: Any, output_schema: dict[str, Any] | None) -> Any:
    """A ``CallToolResult`` as observation content: its structured content when it has some
    (a value the SDK wrapped as ``{"result": value}`` is unwrapped; that is how ``MCPServer``
    sends what a tool annotated ``-> str`` returns, so JSON text from such a tool stays a
    string), else its text (one block: the string, parsed when it is a JSON object or array;
    several: joined by newlines), else its content blocks as JSON."""
    structured = result.structured_content
    if structured is not None:
        declared = set((output_schema or {}).get("properties", {}))
        if declared == {"result"} and isinstance(structured, dict) and set(structured) == {"result"}:
            return structured["result"]
        return structured
    blocks = list(result.content or [])
    if all(getattr(b, "type", None) == "text" for b in blocks):
        text = "\n".join(b.text for b in blocks)
        if len(blocks) == 1 and text.lstrip()[:1] in ("{", "["):
            with contextlib.suppress(ValueError):
                return json.loads(text)
        return text
    return [b.model_dump(mode="json", exclude_none=True, by_alias=True) for b in blocks]


def _error_text(result: Any, tool: str) -> str:
    """The message of an ``isError`` result: its text blocks, joined by newlines, without the
    ``Error executing tool TOOL: `` that the SDK's ``MCPServer`` puts before a ``ToolError``'s
    message (tapekit's own prefix names the server and the tool already). A crash, which that
    SDK reports as only ``Error executing tool TOOL``, is kept as it is."""
    texts = [b.text for b in result.content or [] if getattr(b, "type", None) == "text"]
    text = "\n".join(texts)
    text = text.removeprefix(f"Error executing tool {tool}: ")
    return text or "the tool reported an error without a message"


class MCPEnvironment(ToolEnvironment):
    """A :class:`~tapekit.ToolEnvironment` whose tools come from MCP servers.

    ``servers`` are :class:`StdioServer`, :class:`HTTPServer` or :class:`InProcessServer`;
    ``tools`` and ``handlers`` add Python tools and action handlers as in ``ToolEnvironment``.
    ``timeout_s`` bounds each tool call, ``connect_timeout_s`` each server's start. Tool names
    that clash between servers are prefixed (see :func:`listed_names`); ``prefix_all`` prefixes
    all of them. Each MCP tool's effect (:mod:`tapekit.effects`) comes from its annotations
    (:func:`effect_of_annotations`: read-only, idempotent, else ``"once"``, journalled in a
    stored session), or from ``effects`` (by the name the LLM sees), which overrides them. A
    ``once`` call whose request timed out or whose connection dropped is in doubt, not failed.

    Use it as ``async with MCPEnvironment(...) as env:`` or ``with MCPEnvironment(...) as env:``
    (or :meth:`start` / :meth:`close`). The connections live on the event loop they were
    opened on (a private thread's loop for ``with``); calls from any other loop, such as the
    sync ``main_loop``'s, are handed over to it.
    """

    def __init__(
        self,
        servers: Sequence[ServerSpec],
        tools: Sequence[Callable[..., Any] | Tool] = (),
        handlers: dict[type[Action], ActionHandler] | None = None,
        name: str = "mcp",
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 30.0,
        prefix_all: bool = False,
        effects: dict[str, Effect] | None = None,
    ) -> None:
        super().__init__(tools, handlers, name)
        self.effects = dict(effects or {})
        for tool_name, effect in self.effects.items():
            if effect not in EFFECTS:
                raise ValueError(
                    f"effects[{tool_name!r}] is one of {', '.join(map(repr, EFFECTS))}, not {effect!r}"
                )
        self.servers = _check_specs(servers)
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeout_s and connect_timeout_s must be positive")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.prefix_all = prefix_all
        self.mcp_tools: dict[str, MCPToolInfo] = {}
        self._connections: dict[str, _Connection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._host: asyncio.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """Whether the servers are connected (between start and close)."""
        return self._stop is not None

    async def astart(self) -> None:
        """Start (or connect to) every server and list their tools, on the running loop.

        Raises :class:`MCPServerError` naming the server that could not be started; servers
        started before it are stopped again.
        """
        if self.running:
            raise RuntimeError(f"MCP environment {self.name!r} is already started")
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._loop, self._stop = loop, asyncio.Event()
        self._host = asyncio.ensure_future(self._serve(ready))
        try:
            await ready
        except BaseException:
            await asyncio.gather(self._host, return_exceptions=True)
            self._loop = self._stop = self._host = None
            raise

    async def aclose(self) -> None:
        """Stop every server (stdio processes end) and forget the tools; safe to call twice."""
        if self._stop is None or self._host is None:
            return
        if asyncio.get_running_loop() is not self._loop:
            await self._hop(self.aclose())
            return
        self._stop.set()
        await asyncio.gather(self._host, return_exceptions=True)
        self._loop = self._stop = self._host = None
        self.mcp_tools = {}
        self._connections = {}

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Sync :meth:`astart`: the connections live on an event loop in a private thread."""
        if self.running:
            raise RuntimeError(f"MCP environment {self.name!r} is already started")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"tapekit-mcp-{self.name}", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.astart(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        self._thread = thread

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        if thread is None:  # started with astart on a loop that someone else runs
            raise RuntimeError("this MCP environment was started with astart: close it with await aclose()")
        asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """Hold the connections open in one task (the SDK's task groups must be left in the
        task that entered them) until :meth:`aclose`."""
        assert self._stop is not None
        async with contextlib.AsyncExitStack() as stack:
            try:
                listed: list[tuple[_Connection, Any]] = []
                for spec in self.servers:
                    conn = _Connection(spec)
                    try:
                        async with asyncio.timeout(self.connect_timeout_s):
                            conn.client = await stack.enter_async_context(conn.make_client())
                            tools = await conn.list_tools()
                    except Exception as e:
                        raise MCPServerError(f"cannot start MCP server {spec.name!r}: {_why(e)}") from e
                    self._connections[spec.name] = conn
                    listed.extend((conn, tool) for tool in tools)
                names = listed_names(
                    [(c.spec.name, t.name) for c, t in listed], list(self.tools), self.prefix_all
                )
                self.mcp_tools = {
                    name: MCPToolInfo(
                        name,
                        c.spec.name,
                        t.name,
                        _description(t.description),
                        t.input_schema,
                        t.output_schema,
                        self.effects.get(name, effect_of_annotations(getattr(t, "annotations", None))),
                    )
                    for name, (c, t) in zip(names, listed, strict=True)
                }
            except BaseException as e:
                if not ready.done():
                    ready.set_exception(e)
                self._connections = {}
                return
            ready.set_result(None)
            await self._stop.wait()
            self._connections = {}

    # ------------------------------------------------------------------ tools

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The schemas of the Python tools and of every MCP tool, to put in a prompt's ``tools``."""
        if not self.running:
            raise RuntimeError(
                f"MCP environment {self.name!r} is not started: use `async with` or `with` it first"
            )
        return super().tool_schemas() + [info.schema() for info in self.mcp_tools.values()]

    async def _call_tool(self, call: ToolCall, tape: Tape[Any, Any], index: int) -> ToolResult:
        if call.name in self.tools:
            return await super()._call_tool(call, tape, index)
        info = self.mcp_tools.get(call.name)
        if info is None:
            known = [*self.tools, *self.mcp_tools]
            error = f"unknown tool {call.name!r}; available tools: {', '.join(known) or 'none'}"
            return ToolResult(call_id=call.call_id, name=call.name, error=error)
        if not self.running:
            raise RuntimeError(f"MCP environment {self.name!r} is not started: use `async with` or `with` it")

        async def attempt() -> tuple[Any, str | None]:
            if asyncio.get_running_loop() is not self._loop:
                answer = await self._hop(self._call_mcp(call, info))
            else:
                answer = await self._call_mcp(call, info)
            in_doubt = answer.metadata.other.get("mcp", {}).pop("in_doubt", False)
            if in_doubt and info.effect == "once" and current_journal() is not None:
                raise EffectInDoubt(answer.error or "the server's answer was lost")
            return answer.content, answer.error

        result = await self._run_effect(call, tape, index, info.effect, attempt)
        result.metadata.other["mcp"] = {"server": info.server, "tool": info.tool}
        return result

    async def _hop(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop that holds the connections and await it from this one."""
        assert self._loop is not None
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wrap_future(future)

    async def _call_mcp(self, call: ToolCall, info: MCPToolInfo) -> ToolResult:
        result = ToolResult(call_id=call.call_id, name=call.name)
        result.metadata.other["mcp"] = {"server": info.server, "tool": info.tool}
        where = f"MCP server {info.server!r}, tool {info.tool!r}"
        conn = self._connections.get(info.server)
        if conn is None or conn.closed_reason is not None:
            reason = conn.closed_reason if conn is not None else "it is not connected"
            result.error = f"{where}: the server is not available ({reason})"
            return result
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await conn.client.call_tool(info.tool, dict(call.arguments))
        except TimeoutError:
            result.error = f"{where}: no answer within {self.timeout_s:g} s (timed out)"
            result.metadata.other["mcp"]["in_doubt"] = True  # the request may have been carried out
            return result
        except Exception as e:
            why = _why(e)
            if "closed" in why.lower():
                conn.closed_reason = f"the connection closed: {why}"
                result.error = f"{where}: the server closed the connection (did it crash?): {why}"
                result.metadata.other["mcp"]["in_doubt"] = True
            else:
                result.error = f"{where}: {why}"
            logger.warning("%s failed: %s", where, why)
            return result
        if answer.is_error:
            result.error = f"{where}: {_error_text(answer, info.tool)}"
        else:
            result.content = _result_content(answer, info.output_schema)
        return result


def _why(error: BaseException) -> str:
    """A one-line reason for ``error``, looking inside exception groups (anyio task groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
