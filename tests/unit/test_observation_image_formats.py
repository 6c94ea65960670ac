"""The compat bridge reads an observation image only as a camera's formats (compat/images.py
IMAGE_FORMATS): PIL tried every plugin it has, and EPS runs Ghostscript where it is installed -- a
program run on what a caller sent -- while the rarer decoders are attack surface a camera never needs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.images import IMAGE_FORMATS, _open_image


def _encoded(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 7, np.uint8)).save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP"])
def test_a_cameras_format_is_read(fmt):
    assert fmt in IMAGE_FORMATS
    assert _open_image(_encoded(fmt)).size == (8, 8)


@pytest.mark.parametrize("fmt", ["EPS", "GIF", "TIFF", "PPM"])
def test_any_other_format_is_refused_without_its_decoder(fmt, monkeypatch):
    opened = []
    real_open = Image.open

    def spying_open(fp, mode="r", formats=None):
        opened.append(formats)
        return real_open(fp, mode, formats)

    monkeypatch.setattr(Image, "open", spying_open)
    with pytest.raises(CompatError, match="cannot decode"):
        _open_image(_encoded(fmt))
    assert opened and opened[-1] is not None and fmt not in opened[-1]
