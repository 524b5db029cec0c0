"""Flow templates (seed 000's Flow mode), working against the demo server ``sds-company-data``.

An agent in ``flow`` mode names one of these ``build_graph`` functions (or its own) as its ``flow_graph``:
``agents.flows.sequential.build_graph``, ``agents.flows.parallel.build_graph``,
``agents.flows.conditional.build_graph``, ``agents.flows.http_pipeline.build_graph``. Each node that needs a
tool calls it through the module's ``MCPHandle`` (and so through the gate). The server is the agent's
``model_params["flow"]["mcp_id"]`` (default ``sds-company-data``).
"""

from __future__ import annotations

from django.conf import settings

FLOW_TEMPLATES = (
    "agents.flows.sequential.build_graph",
    "agents.flows.parallel.build_graph",
    "agents.flows.conditional.build_graph",
    "agents.flows.http_pipeline.build_graph",
)


def registered_flow_graphs() -> list[str]:
    """The flow graphs an admin may choose and a worker runs: the shipped templates and ``PLATFORM_FLOW_GRAPHS``
    (dotted paths)."""
    extra = getattr(settings, "PLATFORM_FLOW_GRAPHS", [])
    return list(dict.fromkeys([*FLOW_TEMPLATES, *extra]))
