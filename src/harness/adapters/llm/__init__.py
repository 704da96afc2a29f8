"""LLM providers behind one port (SPEC P3): scripted (offline default), OpenAI-compatible, Anthropic."""
