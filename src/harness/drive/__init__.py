"""Driving Runs: the one write path of a Run's state, the drive under a lease, the workers that run it,
and the sweeper that finds Runs stuck anywhere."""
