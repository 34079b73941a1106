"""The command line: ``python -m tuning``'s commands, their argument types and the newcomer guard."""

from tuning.cli.commands import main

__all__ = ["main"]
