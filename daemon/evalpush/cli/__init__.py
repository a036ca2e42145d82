"""The `evalpush` command: its entry point (`main`), parser (`parser`), the commands on the
ledger (`ledger`) and `check` (`check`), what they print (`report`), and the demo (`demo`)."""

from evalpush.cli.main import main

__all__ = ["main"]
