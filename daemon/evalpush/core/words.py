"""Counts and durations in words: `1 run`, `2 runs`, `1,000,000 runs`; `42s`, `4m12s`, `1h02m`."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` (`1,234` past a thousand) and `noun`, the noun in the plural (`plural`, else
    `noun` + "s") unless the count is one."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def format_duration(seconds: float) -> str:
    """A duration for people, two units at most: `42s`, `4m12s`, `1h02m`, `3d04h`."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
