"""The GF(2) algebra behind vkmulti's CRC32 engines (zlib's IEEE CRC-32).

A raw CRC (register from 0, no final xor) is linear: the raw CRC of A||B is
Z(|B|)(raw(A)) ^ raw(B), where Z(n) appends n zero bytes to a register, a
32x32 bit matrix. Z(n) is applied as 4 lookups in a 4x256 table
(`zero_tables()[k]` is Z(2**k)); any n is the product of the tables of its
set bits. Both engines use this: the GPU shader (gpu_crc.py) splits a range
into per-lane pieces and combines them with the tables, the host engine
(host_crc.py) hashes pieces with zlib on several threads and combines them.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["zero_tables", "shift", "crc32_finish", "crc32_combine", "raw_crc"]

_U32 = 0xFFFFFFFF
_POLY = 0xEDB88320


@lru_cache(maxsize=1)
def zero_tables() -> np.ndarray:
    """uint32[32, 4, 256]: [k, j, v] = Z(2**k)(v << 8j). [0, 0] is zlib's byte table."""
    byte = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        byte = np.where(byte & 1, (byte >> 1) ^ np.uint32(_POLY), byte >> 1).astype(np.uint32)
    one = np.empty((4, 256), np.uint32)
    one[0] = byte
    for j in range(1, 4):   # Z(1)(v << 8j) = v << 8(j-1): the low byte is zero
        one[j] = np.arange(256, dtype=np.uint32) << np.uint32(8 * (j - 1))
    out = np.empty((32, 4, 256), np.uint32)
    out[0] = one
    for k in range(1, 32):
        prev = out[k - 1]
        out[k] = _apply(prev, prev)   # Z(2n) = Z(n) o Z(n), column by column
    out.setflags(write=False)
    return out


def _apply(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    return table[0][x & 0xFF] ^ table[1][(x >> 8) & 0xFF] ^ table[2][(x >> 16) & 0xFF] ^ table[3][x >> 24]


def shift(x: int, nbytes: int) -> int:
    """Z(nbytes)(x): the raw CRC register `x` after `nbytes` more zero bytes."""
    if nbytes < 0:
        raise ValueError(f"a shift appends zero bytes: nbytes must be >= 0, got {nbytes}")
    t = zero_tables()
    k = 0
    while nbytes:
        if nbytes & 1:
            x = int(t[k, 0, x & 0xFF] ^ t[k, 1, (x >> 8) & 0xFF] ^ t[k, 2, (x >> 16) & 0xFF] ^ t[k, 3, x >> 24])
        nbytes >>= 1
        k += 1
    return x & _U32


def crc32_finish(raw: int, nbytes: int) -> int:
    """zlib's CRC32 from the raw CRC (register from 0, no final xor) of `nbytes` bytes."""
    return (raw ^ shift(_U32, nbytes) ^ _U32) & _U32


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """zlib.crc32(a + b) from zlib.crc32(a), zlib.crc32(b) and len(b) (zlib's crc32_combine)."""
    return (shift(crc_a, len_b) ^ crc_b) & _U32


def raw_crc(data: bytes) -> int:
    """The raw CRC of `data` (for tests: bytewise, the definition itself)."""
    t = zero_tables()[0, 0]
    c = 0
    for b in data:
        c = (c >> 8) ^ int(t[(c ^ b) & 0xFF])
    return c
