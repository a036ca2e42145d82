"""The `evalpush` command: its subcommands, what they print, and the demo."""

from evalpush.cli.demo import write_sample_runs
from evalpush.cli.main import main
from evalpush.cli.report import status_rows

__all__ = ["main", "status_rows", "write_sample_runs"]
