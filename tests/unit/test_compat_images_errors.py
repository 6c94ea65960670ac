"""An observation PIL cannot finish decoding (a broken EXIF block, a palette of bad values) is the
client's error (CompatError, "cannot decode"), not an internal error of the bridge."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.foreign import ForeignObject, dumps_foreign
from candidate_scheduler.compat.images import image_to_rgb_array, observations
from candidate_scheduler.compat.unpickle import safe_loads


def _pickled_pil(mode: str, data: bytes, palette=None, info=None):
    state = [info or {}, mode, (4, 3), palette, data]
    return safe_loads(dumps_foreign(ForeignObject("PIL.Image", "Image", state=state)))


def _png_with_exif(exif: bytes) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3)).save(buf, "PNG", exif=exif)
    return buf.getvalue()


@pytest.mark.parametrize("image", [
    pytest.param(lambda: _pickled_pil("RGB", b"\x01" * 36, info={"exif": b"garbage"}), id="pickled-bad-exif"),
    pytest.param(lambda: _pickled_pil("P", b"\x01" * 12, palette=[300] * 6), id="palette-over-255"),
    pytest.param(lambda: _pickled_pil("P", b"\x01" * 12, palette=["a"]), id="palette-of-strings"),
    pytest.param(lambda: _png_with_exif(b"garbage"), id="png-bad-exif"),
])
def test_an_image_pil_cannot_finish_is_a_typed_error(image):
    with pytest.raises(CompatError, match="cannot decode the observation image"):
        image_to_rgb_array(image())
    with pytest.raises(CompatError):
        observations([image(), image()])


def test_good_images_still_decode():
    assert image_to_rgb_array(_pickled_pil("P", b"\x01" * 12, palette=[1, 2, 3] * 2)).shape == (3, 4, 3)
    assert image_to_rgb_array(_png_with_exif(Image.Exif().tobytes())).shape == (3, 4, 3)


def test_a_server_path_that_is_no_readable_image_gets_one_answer_however_it_fails(tmp_path):
    """Told apart, the answers said which server paths exist: a missing file, a directory, a file that is no
    image, an unreadable one (a FIFO here: a device would block)."""
    import os

    from candidate_scheduler.compat.images import image_to_rgb_array

    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    answers = set()
    for name in ("missing.png", "folder", "notes.txt", "fifo"):
        with pytest.raises(CompatError) as refused:
            image_to_rgb_array(str(tmp_path / name))
        answers.add(str(refused.value).replace(name, "NAME"))
    assert len(answers) == 1, answers
    assert "not a readable image file" in answers.pop()
