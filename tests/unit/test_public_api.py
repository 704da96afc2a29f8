"""The package's public names: what `from harness import …` offers, and that each one resolves."""

from __future__ import annotations

import harness


def test_all_lists_exactly_the_lazy_exports_and_the_version() -> None:
    assert sorted(harness.__all__) == sorted([*harness._EXPORTS, "__version__"])
    assert len(harness.__all__) == len(set(harness.__all__))


def test_every_public_name_resolves() -> None:
    for name in harness.__all__:
        assert getattr(harness, name) is not None, name
