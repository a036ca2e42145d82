"""Compression bombs for the `gzip_bomb` fault: small bodies that inflate to `INFLATED_BYTES`
of zeros, made without compressing that much (the deflate block that encodes one MiB of zeros
after a MiB of zeros is the same every time, so it is repeated)."""

from __future__ import annotations

import functools
import gzip
import struct
import zlib

MIB = 1024 * 1024
INFLATED_BYTES = 4096 * MIB
"""What a bomb inflates to: 4 GiB."""


@functools.cache
def _gzip_of_zeros() -> bytes:
    """One gzip member holding `INFLATED_BYTES` zeros (about 4 MiB)."""
    zeros = bytes(MIB)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = deflate.compress(zeros) + deflate.flush(zlib.Z_SYNC_FLUSH)
    repeated = deflate.compress(zeros) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert deflate.compress(zeros) + deflate.flush(zlib.Z_SYNC_FLUSH) == repeated
    last = deflate.flush()  # the final (empty) block
    blocks = INFLATED_BYTES // MIB
    crc = 0
    for _ in range(blocks):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    body = first + repeated * (blocks - 1) + last
    return header + body + struct.pack("<II", crc, INFLATED_BYTES & 0xFFFFFFFF)


@functools.cache
def bomb(encoding: str) -> bytes:
    """A body that inflates to `INFLATED_BYTES` under `Content-Encoding: encoding` (`gzip`, or
    stacked: `gzip, gzip`, about 40 KB)."""
    codings = [c.strip() for c in encoding.split(",")]
    if not codings or any(c != "gzip" for c in codings):
        raise ValueError(f"a bomb is gzip, once or stacked, not {encoding!r}")
    body = _gzip_of_zeros()
    for _ in codings[1:]:
        body = gzip.compress(body, 9)
    return body
