"""A minimal RGB canvas that writes PNG files (zlib + struct), so plots need no matplotlib."""
from __future__ import annotations

import struct
import zlib


class Canvas:
    def __init__(self, width: int, height: int, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x0: float, y0: float, x1: float, y1: float, color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the canvas; at least one pixel wide."""
        xa, xb = max(0, int(x0)), min(self.width, max(int(x1), int(x0) + 1))
        ya, yb = max(0, int(y0)), min(self.height, max(int(y1), int(y0) + 1))
        row = bytes(color) * (xb - xa)
        for y in range(ya, yb):
            start = (y * self.width + xa) * 3
            self.pixels[start:start + len(row)] = row

    def save(self, path: str) -> None:
        raw = b"".join(b"\x00" + bytes(self.pixels[y * self.width * 3:(y + 1) * self.width * 3])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                    + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
