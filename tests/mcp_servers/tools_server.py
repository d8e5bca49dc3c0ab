"""A small MCP server written with the SDK's own helper (``MCPServer``, once ``FastMCP``).

Run ``python tools_server.py NAME`` for stdio, or ``python tools_server.py NAME --http PORT`` for
streamable HTTP on 127.0.0.1. ``NAME`` becomes the server's name and is echoed by ``whoami``,
so a test with two servers can tell them apart (both have a tool called ``whoami``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel


class Sum(BaseModel):
    """A structured tool result."""

    total: int
    terms: list[int]


def build(name: str, only: set[str] | None = None) -> MCPServer:
    """The server: arithmetic, echo (structured and plain), failures (deliberate and not), a
    hang and a crash of the process on demand; ``only`` keeps just the tools named in it."""
    server = MCPServer(name, log_level="WARNING")

    def tool(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        return server.tool(**options)(fn) if only is None or fn.__name__ in only else fn

    @tool
    def add(numbers: list[int]) -> Sum:
        """Add numbers together.

        Args:
            numbers: the numbers to add
        """
        return Sum(total=sum(numbers), terms=numbers)

    @tool
    def shout(text: str) -> str:
        """The text in capitals."""
        return text.upper()

    def echo(text: str) -> str:
        """The text as it is, sent as a text block only (no structured content)."""
        return text

    tool(echo, structured_output=False)

    @tool
    def whoami() -> str:
        """The name of this server."""
        return name

    @tool
    def fail(message: str) -> str:
        """Always fails with ``message`` (reported to the client as ``isError``)."""
        raise ToolError(message)

    @tool
    def crash() -> str:
        """Fails with an unexpected exception (the SDK withholds its text from the client)."""
        raise RuntimeError("a secret from the server's log")

    @tool
    async def hang(seconds: float = 3600.0) -> str:
        """Sleeps (a tool that never answers in time)."""
        await asyncio.sleep(seconds)
        return "woke up"

    @tool
    def die() -> str:
        """Kills the server process without answering."""
        sys.stdout.flush()
        os._exit(3)

    @tool
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    return server


def main() -> None:
    """Parse the command line and serve."""
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on this port")
    parser.add_argument("--tools", default="", help="comma-separated tools to keep (default: all)")
    args = parser.parse_args()
    server = build(args.name, set(args.tools.split(",")) if args.tools else None)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
