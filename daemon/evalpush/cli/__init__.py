"""The `evalpush` command: its entry point (`main`), parser (`parser`), the commands on the
ledger (`ledger`) and `check` (`check`), what `status` prints (`report`) and what `push` prints
(`push_report`), and the demo (`demo`)."""

from evalpush.cli.main import main

__all__ = ["main"]
