"""evalpush: the upload daemon for verifiers eval runs.

The pipeline, one module per stage: discover -> runs -> read -> convert -> batch ->
platform/upload, with the ledger advanced only on the platform's acknowledgement.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]

import sys as _sys
import types as _types

# httpx imports its command-line client (`httpx._main`, which imports click, rich and pygments)
# whenever they are installed, and rich (push's progress bar on a terminal) brings them: about
# a seventh of `evalpush push`'s imports before its first request. evalpush never runs that
# client, so unless something imported httpx already, a stand-in takes its place.
if "httpx" not in _sys.modules:
    _httpx_cli = _types.ModuleType("httpx._main", "httpx's command-line client: not loaded")

    def _no_httpx_cli() -> None:
        raise SystemExit("httpx's command-line client is not loaded inside evalpush")

    _httpx_cli.main = _no_httpx_cli  # type: ignore[attr-defined]
    _sys.modules.setdefault("httpx._main", _httpx_cli)
