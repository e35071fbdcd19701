"""The storyboard's frames: tiny PNG files drawn with a pure-Python PNG writer (zlib + struct).

`python -m examples.storyboard.frames_png` redraws examples/storyboard/frames/. The files are
committed: the bytes of a frame must stay the same from step to step (its hash is part of the
cached prompt prefix), so they are drawn once, deterministically.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

FRAMES = Path(__file__).parent / "frames"
WIDTH, HEIGHT = 96, 54

Pixel = tuple[int, int, int]


def png_bytes(rows: list[list[Pixel]]) -> bytes:
    """An 8-bit RGB PNG of `rows` (each a list of (r, g, b))."""
    height, width = len(rows), len(rows[0])
    raw = b"".join(
        b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in rows
    )

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + tag
            + data
            + struct.pack(">I", zlib.crc32(tag + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


# shot number -> (sky colour, ground colour, subject colour, subject x as a share of the width)
SHOTS: dict[int, tuple[Pixel, Pixel, Pixel, float]] = {
    1: ((40, 60, 120), (30, 90, 40), (230, 200, 60), 0.20),
    2: ((70, 90, 150), (40, 100, 50), (230, 200, 60), 0.40),
    3: ((200, 120, 60), (90, 70, 40), (220, 40, 40), 0.50),
    4: ((200, 120, 60), (90, 70, 40), (220, 40, 40), 0.70),
    5: ((20, 20, 50), (40, 40, 40), (240, 240, 240), 0.55),
    6: ((10, 10, 30), (20, 20, 20), (240, 240, 240), 0.85),
}


def draw(shot: int) -> list[list[Pixel]]:
    sky, ground, subject, x_share = SHOTS[shot]
    horizon = HEIGHT * 2 // 3
    cx, cy, r = int(WIDTH * x_share), horizon - 8, 7
    rows: list[list[Pixel]] = []
    for y in range(HEIGHT):
        row: list[Pixel] = []
        for x in range(WIDTH):
            if (x - cx) ** 2 + (y - cy) ** 2 <= r * r:
                row.append(subject)
            elif y < horizon:
                shade = y * 40 // horizon
                row.append(
                    (
                        min(255, sky[0] + shade),
                        min(255, sky[1] + shade),
                        min(255, sky[2] + shade),
                    )
                )
            else:
                row.append(ground)
        rows.append(row)
    return rows


def frame_path(shot: int) -> Path:
    return FRAMES / f"shot_{shot:02d}.png"


def main() -> None:
    FRAMES.mkdir(exist_ok=True)
    for shot in SHOTS:
        frame_path(shot).write_bytes(png_bytes(draw(shot)))
        print(frame_path(shot))


if __name__ == "__main__":
    main()
