"""The HTTP routes: runs, approvals, operations (jobs, audit, health, metrics) and the console."""
