"""Pushes to the Caller and the approvers (SPEC P4 / N1; seed 004 §4.1 arrows ⑩ and ⑱).

An approval request that opens, escalates, is decided or times out, and every Run that parks for a human
or reaches its final state, becomes an event queued in the webhook outbox inside the transaction of that
change (`notifier`). Delivery processes send the queued events signed in the Standard Webhooks format,
retry them with exponential backoff and end them delivered or dead (`delivery`). The endpoints, their
signing secrets and the retry schedule are configuration (`config`).
"""
