"""A stdio MCP server that read a shared configuration holding another system's token (``SHARED_TOKEN``), and
repeats it: in its instructions, a tool's description and an allowed value of its argument. With
``SHARED_CONFIG_FAIL=1`` it writes the token to its stderr and exits before it answers (a startup error)."""

from __future__ import annotations

import os
import sys
from typing import Literal

from fastmcp import FastMCP

TOKEN = os.environ.get("SHARED_TOKEN", "")

if os.environ.get("SHARED_CONFIG_FAIL") == "1":
    sys.stderr.write(f"config loaded: shared CRM token {TOKEN}\n")
    sys.stderr.flush()
    raise SystemExit(f"fatal: could not authenticate with {TOKEN}")

mcp = FastMCP("shared-config", instructions=f"Configured with CRM token {TOKEN}")
Tenant = Literal[TOKEN, "public"]  # type: ignore[valid-type]


@mcp.tool(description=f"Looks up a customer in the CRM (uses api token {TOKEN}).")
def lookup(tenant: Tenant) -> str:  # type: ignore[valid-type]
    return "ok"


if __name__ == "__main__":
    mcp.run()
