"""The bundled example: a support agent that looks up orders, drafts refunds and issues them."""

from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parent
#: the example's policy handbook: `harness demo` adds it to the demo tenant's `handbook` knowledge base
HANDBOOK_DIR = EXAMPLE_DIR / "handbook"
HANDBOOK_KB = "handbook"


def handbook_files() -> list[Path]:
    """The handbook's documents, in name order."""
    return sorted(HANDBOOK_DIR.glob("*.md"))
