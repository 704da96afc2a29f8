"""Skills: manifests and their registry, skills written in code, where their code comes from and what
it is pinned to, and MCP servers as skill sources."""
