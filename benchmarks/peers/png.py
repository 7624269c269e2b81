"""A tiny PNG writer (zlib + struct): filled rectangles and 3x5 bitmap digits. No matplotlib."""
from __future__ import annotations

import struct
import zlib

_GLYPHS = {  # 3x5, rows top to bottom
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", " ": "000000000000000",
}


class Canvas:
    def __init__(self, w: int, h: int, bg=(255, 255, 255)):
        self.w, self.h = w, h
        self.px = bytearray(bytes(bg) * (w * h))

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb) -> None:
        x0, x1 = max(0, min(x0, x1)), min(self.w, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.h, max(y0, y1))
        row = bytes(rgb) * (x1 - x0)
        for y in range(y0, y1):
            i = (y * self.w + x0) * 3
            self.px[i:i + len(row)] = row

    def text(self, x: int, y: int, s: str, rgb=(0, 0, 0), scale: int = 2) -> None:
        for ch in s:
            glyph = _GLYPHS.get(ch, _GLYPHS[" "])
            for k, bit in enumerate(glyph):
                if bit == "1":
                    gx, gy = x + (k % 3) * scale, y + (k // 3) * scale
                    self.rect(gx, gy, gx + scale, gy + scale, rgb)
            x += 4 * scale

    @staticmethod
    def text_width(s: str, scale: int = 2) -> int:
        return 4 * scale * len(s) - scale

    def save(self, path: str) -> None:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3])
                       for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + tag + data
                    + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

        png = (b"\x89PNG\r\n\x1a\n"
               + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
               + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
        with open(path, "wb") as f:
            f.write(png)


def _fmt(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def bar_chart(path: str, groups: list[str], series: list[str], panels: list[list[list]],
              colors: dict) -> None:
    """`panels[p][g][s]`: value (or None) of series s in group g of panel p. Panels are
    stacked vertically, each scaled to its own max; values are printed above the bars;
    group k (1-based) is numbered under its bars (legend: the Markdown report)."""
    bar, gap, group_gap, pad, panel_h, label_h = 22, 4, 30, 20, 240, 26
    group_w = len(series) * (bar + gap) - gap
    width = pad * 2 + len(groups) * group_w + (len(groups) - 1) * group_gap
    height = pad + len(panels) * (panel_h + label_h + pad)
    c = Canvas(max(width, 120), height)
    for p, values in enumerate(panels):
        top = pad + p * (panel_h + label_h + pad)
        base = top + panel_h
        vmax = max((v for g in values for v in g if v is not None), default=1.0) or 1.0
        c.rect(pad - 6, top, pad - 4, base, (0, 0, 0))
        c.rect(pad - 6, base, width - pad + 6, base + 2, (0, 0, 0))
        for g, row in enumerate(values):
            gx = pad + g * (group_w + group_gap)
            c.text(gx + group_w // 2 - c.text_width(str(g + 1)) // 2, base + 8, str(g + 1))
            for s, v in enumerate(row):
                if v is None:
                    continue
                x = gx + s * (bar + gap)
                h = int((panel_h - 26) * v / vmax)
                c.rect(x, base - h, x + bar, base, colors[series[s]])
                label = _fmt(v)
                scale = 2 if c.text_width(label, 2) <= bar + gap + 6 else 1
                c.text(x + bar // 2 - c.text_width(label, scale) // 2,
                       base - h - 5 * scale - 4, label, scale=scale)
    c.save(path)
