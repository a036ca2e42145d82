"""The `evalpush` command: its subcommands (`main`), what they print (`report`), and the demo
(`demo`). The face is `main`; the other modules are imported where they are needed, so a
command loads only what it runs."""

from evalpush.cli.main import main

__all__ = ["main"]
