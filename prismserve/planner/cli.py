"""`prismserve plan`: placeholder until the planner lands."""

from __future__ import annotations

import argparse


def add_plan_command(sub: argparse._SubParsersAction) -> None:
    """Register the `plan` subcommand."""
