"""GPU-side subcommands of replay (calibrate), registered in pagecast.cli."""

from __future__ import annotations

from pagecast.command import Command

COMMANDS: list[Command] = []
