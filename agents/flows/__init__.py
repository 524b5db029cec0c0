"""Flow templates (seed 000's Flow mode), working against the demo server ``sds-company-data``.

An agent in ``flow`` mode names one of these ``build_graph`` functions (or its own) as its ``flow_graph``:
``agents.flows.sequential.build_graph``, ``agents.flows.parallel.build_graph``,
``agents.flows.conditional.build_graph``, ``agents.flows.http_pipeline.build_graph``. Each node that needs a
tool calls it through the module's ``MCPHandle`` (and so through the gate). The server is the agent's
``model_params["flow"]["mcp_id"]`` (default ``sds-company-data``).
"""
