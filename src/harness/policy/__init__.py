"""The policy engine's rule families (SPEC G1): permission (Cedar), budget, guardrail, risk routing."""
