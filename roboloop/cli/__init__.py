"""The `roboloop` command (`roboloop.cli:run`, `python -m roboloop.cli`): roboloop/cli/main.py assembles the parser
from one module per command group; common.py holds what they share."""

from roboloop.cli.main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
