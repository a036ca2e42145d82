"""evalpush: the upload daemon for verifiers eval runs.

The pipeline, one module per stage: discover -> runs -> read -> convert -> batch ->
platform/upload, with the ledger advanced only on the platform's acknowledgement.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
