"""MCP servers that the MCP tests start (stdio subprocesses and a streamable HTTP process)."""
