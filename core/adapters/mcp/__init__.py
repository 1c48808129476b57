"""MCP, in one adapter: the only package that imports the ``mcp`` SDK (and its ``mcp_types``).

* ``client``: one connection to an MCP server (streamable HTTP or a stdio command), held open by a
  task of its own, with a time limit on every request; what it lists and returns is plain Pepper
  values (``ToolDefinition``, ``CallResult``), never SDK types;
* ``loopback``: MCP servers built with the SDK for tests and benchmarks (on 127.0.0.1, or a stdio
  child process), whose tools and faults a test sets.
"""
