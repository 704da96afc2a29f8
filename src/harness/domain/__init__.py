"""The domain: plain value types and errors that everyone depends on and that depend on no one.

Requests and results of a Run (`contracts`), plans and verdicts, LLM requests and responses (`llm`),
trace record kinds (`traces`), what the Run store takes and gives back (`records`), sandbox jobs
(`sandbox`), the hash-chain encoding (`chain`), ids and errors. Nothing here imports anything of
harness outside `harness.domain` and the pure kernel (`harness.kernel`), and nothing here does I/O.
"""
