"""Configuration: every setting defined once, read from the file, the environment and the flags, and validated."""

from evalpush.config.load import load_config
from evalpush.config.settings import (
    NOT_SETTINGS,
    Config,
    LedgerConfig,
    LogConfig,
    MetricsConfig,
    PlatformConfig,
    ReadConfig,
    RunsConfig,
    UploadConfig,
    WatchConfig,
    read_toml,
    section_keys,
    sections,
)

__all__ = [
    "Config",
    "LedgerConfig",
    "LogConfig",
    "MetricsConfig",
    "NOT_SETTINGS",
    "PlatformConfig",
    "ReadConfig",
    "RunsConfig",
    "UploadConfig",
    "WatchConfig",
    "load_config",
    "read_toml",
    "section_keys",
    "sections",
]
