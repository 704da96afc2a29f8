"""Replay: re-execute a finished Run's path from its recording and report any divergence."""
