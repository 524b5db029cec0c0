"""``sds-company-data``: the demo MCP server of seed 001 (stdio), shipped with the platform.

Run it as a child process: ``python -m mcpregistry.demo_server``. Its failure injection is chosen per
server binding through the environment (``FAILURE_MODE``: ``none`` | ``timeout`` | ``rate_limit`` |
``bad_schema``), so one binding can be healthy while another, bound to the same program, fails.
"""
