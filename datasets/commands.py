"""Subcommands of this stage, registered in pagecast.cli."""

from __future__ import annotations

from pagecast.command import Command

COMMANDS: list[Command] = []
