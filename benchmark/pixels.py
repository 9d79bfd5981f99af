"""Pixels of a stored image, the one way import and eval read them (``docs/hub.md`` section 7): 16-bit scaled (not
clipped), transparency composited on white. Sizes are bounded from the header, before any pixel is decoded or resized
(:func:`check_size`): a PNG of a few hundred bytes may claim 20000x2 pixels, which timm's resize would turn into 2 GB.
``MAX_PIXELS`` is Pillow's decompression-bomb threshold; ``MAX_ASPECT`` keeps a resize of the shorter side to <= 600
pixels under 54 MB."""

from __future__ import annotations

import io

MAX_SIDE = 32768
MAX_PIXELS = 89_478_485
MAX_ASPECT = 50


class ImageSizeError(ValueError):
    """An image whose header claims sides outside the bounds."""


def check_size(size: tuple[int, int]) -> None:
    """Refuse a ``(width, height)`` from an image header outside the bounds (the caller names the file)."""
    w, h = size
    if w < 1 or h < 1:
        raise ImageSizeError(f"{w}x{h} pixels: an image needs at least one pixel per side")
    if max(w, h) > MAX_SIDE:
        raise ImageSizeError(f"{w}x{h} pixels: a side over the {MAX_SIDE}-pixel limit; resize the image")
    if w * h > MAX_PIXELS:
        raise ImageSizeError(f"{w}x{h} pixels: {w * h} pixels, over the {MAX_PIXELS}-pixel limit; resize the image")
    if max(w, h) > MAX_ASPECT * min(w, h):
        raise ImageSizeError(f"{w}x{h} pixels: sides in a ratio of {max(w, h) / min(w, h):.0f}:1, over the "
                             f"{MAX_ASPECT}:1 limit; crop the image")


def size_of(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from an encoded image's header, without decoding its pixels."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.size


_GRAY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N"}


def to_8bit(im):
    """Pillow image of any mode -> 8-bit ``RGB`` or ``L``, the same picture; the size is checked first."""
    import numpy as np
    from PIL import Image

    check_size(im.size)
    mode = im.mode
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        a = np.asarray(im)
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise ValueError(f"{mode} image with values outside 0..65535; save it with 8 or 16 bits per channel")
        a = (a.astype(np.uint32) * 255 + 32767) // 65535  # round(v / 257): 16 bits scaled, not clipped
        return Image.fromarray(a.astype(np.uint8), "L")
    if mode == "F":
        raise ValueError("floating-point image; save it with 8 or 16 bits per channel")
    if mode == "1":
        return im.convert("L")
    if "transparency" not in im.info and mode in ("L", "RGB", "P"):
        return im if mode != "P" else im.convert("RGB")
    if mode in ("LA", "La", "RGBA", "RGBa", "PA", "P", "L", "RGB"):
        rgba = im.convert("RGBA")  # palette/tRNS transparency become alpha
        flat = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        flat.alpha_composite(rgba)  # composite on white: what a viewer shows
        out = flat.convert("RGB")
        return out.convert("L") if mode in _GRAY_MODES else out
    return im.convert("RGB")  # CMYK, YCbCr, LAB, HSV, ...


def to_rgb(im):
    """Pillow image of any mode -> 8-bit ``RGB`` (what every model in eval sees)."""
    out = to_8bit(im)
    return out if out.mode == "RGB" else out.convert("RGB")
