"""The tamper-evident audit trail: hash chain, Merkle checkpoints, export and verification (SPEC A3, A3b)."""
