"""Pixels of a stored image, the one way import and eval read them.

``bench import-folder`` stores 8-bit RGB or grayscale pixels; a suite from elsewhere may still hold
16-bit, transparent, palette or CMYK images. Both sides convert with :func:`to_8bit` /
:func:`to_rgb`, so a 16-bit PNG is scaled (not clipped to white, as ``Image.convert("RGB")`` does)
and transparency is composited on white wherever an image is read.
"""

from __future__ import annotations

_GRAY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N"}


def to_8bit(im):
    """Pillow image of any mode -> 8-bit ``RGB`` or ``L`` with the same picture."""
    import numpy as np
    from PIL import Image

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
    if mode in ("L", "RGB"):
        if "transparency" not in im.info:
            return im
    if mode in ("LA", "La", "RGBA", "RGBa", "PA", "P", "L", "RGB"):
        if mode == "P" and "transparency" not in im.info:
            return im.convert("RGB")
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
