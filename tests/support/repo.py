"""The checkout the tests run from, for what is not installed (deploy/, docs/, bench/)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO"]

REPO = Path(__file__).resolve().parents[2]
