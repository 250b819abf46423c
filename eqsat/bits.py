"""Float attributes as the e-graph stores them: the float64 bit pattern as a signed 64-bit
integer (so -0.0, infinities and NaN payloads survive). A leaf module: the op table, the
graph and the typing read it."""

from __future__ import annotations

import struct


def float_bits(value: float) -> int:
    """The float64 bit pattern of ``value`` as a signed 64-bit integer."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def bits_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]
