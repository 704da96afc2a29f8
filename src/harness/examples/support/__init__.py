"""The bundled example: a support agent that looks up orders, drafts refunds and issues them."""

from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parent
