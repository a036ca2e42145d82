"""evalpush: the upload daemon for verifiers eval runs.

The pipeline, one module per stage: discover -> runs -> read -> convert -> batch ->
platform/upload, with the ledger advanced only on the platform's acknowledgement.
"""

__version__ = "0.4.0"
"""The one place the version is written: the package's metadata (pyproject.toml) reads it from
here. It changes with every release, with an entry in CHANGELOG.md."""
__all__ = ["__version__"]
