"""Observations as sglang requests carry them (``Req.image_path``), decoded to uint8 RGB arrays.

One observation is a local path, a ``data:`` URL, encoded image bytes, a PIL image rebuilt from its
pickle, or a uint8 array; a list of several (or a [B, H, W, C] array) is a batch of observations.
Decoding follows sglang's ``load_image`` (EXIF transpose, then ``convert("RGB")``). URLs are never
fetched."""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
import stat
from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.unpickle import MAX_ARRAY_BYTES, MAX_IMAGE_PIXELS, PILImageStub
from candidate_scheduler.core.request import MAX_OBSERVATIONS_PER_GROUP

log = logging.getLogger("candidate_scheduler.compat")

MAX_IMAGE_FILE_BYTES = MAX_ARRAY_BYTES
# The formats an observation image may be read as. PIL tries every plugin it has otherwise: EPS runs
# Ghostscript where it is installed, and the rarer decoders are more attack surface than a camera needs.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "MPO")
MAX_OBSERVATIONS = MAX_OBSERVATIONS_PER_GROUP


def _observation_list(image_path: Any) -> list:
    if isinstance(image_path, (list, tuple)):
        items = list(image_path)
    elif isinstance(image_path, np.ndarray) and image_path.ndim == 4:
        items = list(image_path)
    else:
        items = [image_path]
    if not items or any(i is None for i in items):
        raise CompatError("Cosmos3 policy input requires an observation image (image_path)")
    if len(items) > MAX_OBSERVATIONS:
        raise CompatError(f"at most {MAX_OBSERVATIONS} observations per request")
    return items


def image_to_rgb_array(image: Any) -> np.ndarray:
    """One observation as uint8 [H, W, 3] RGB, decoded like sglang's ``load_image`` (EXIF transpose,
    then ``convert("RGB")``). Accepts a local path, a data: URL, encoded image bytes, a PIL image
    (rebuilt from its pickle) or a uint8 array [H, W], [H, W, 3] or [H, W, 4]."""
    from PIL import Image, ImageOps

    if isinstance(image, PILImageStub):
        pil = _decoding(image.to_pil)
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise CompatError(f"observation arrays must be uint8, got {image.dtype}")
        if image.ndim == 3 and image.shape[-1] == 3:
            return np.ascontiguousarray(image)
        if image.ndim == 2 or (image.ndim == 3 and image.shape[-1] in (1, 4)):
            pil = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image)
        else:
            raise CompatError(f"observation array must be [H, W], [H, W, 3] or [H, W, 4], got {list(image.shape)}")
    elif isinstance(image, (str, bytes, bytearray)):
        pil = _open_image(image)
    else:
        raise CompatError(f"observation image of type {type(image).__name__} is not supported; send a path, "
                          "a data: URL, image bytes, a PIL image or a uint8 array")
    if pil.width * pil.height > MAX_IMAGE_PIXELS:
        raise CompatError(f"observation of {pil.width}x{pil.height} pixels is over the limit")
    return _decoding(lambda: np.asarray(ImageOps.exif_transpose(pil).convert("RGB"), dtype=np.uint8))


def _decoding(step):
    """`step()`; what PIL raises on a client's broken image (an EXIF block that is no TIFF, palette
    entries over 255, ...: SyntaxError, OverflowError, TypeError) is the client's error."""
    try:
        return step()
    except CompatError:
        raise
    except Exception as exc:
        raise CompatError(f"cannot decode the observation image: {type(exc).__name__}: {str(exc)[:200]}") from None


def _read_local_file(path: str) -> bytes:
    """The bytes of a regular file at `path`. Opened without blocking and checked on the open descriptor
    (no race with a rename): a FIFO, a device or a directory named by a client would otherwise hold one
    of the bridge's executor threads forever, or read without end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        raise CompatError(f"observation image path {path[:200]!r} is not a readable file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CompatError(f"observation image path {path[:200]!r} is not a regular file")
        if st.st_size > MAX_IMAGE_FILE_BYTES:
            raise CompatError("observation image file is too large")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1  # closed with f
            return f.read(MAX_IMAGE_FILE_BYTES + 1)
    except OSError:
        raise CompatError(f"observation image path {path[:200]!r} is not a readable file") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _open_image(source: str | bytes | bytearray):
    from PIL import Image

    if isinstance(source, str):
        if source.startswith("data:"):
            try:
                raw = base64.b64decode(source.split(",", 1)[1], validate=False)
            except (IndexError, binascii.Error):
                raise CompatError("bad data: URL for the observation image") from None
        elif source.startswith(("http://", "https://")):
            raise CompatError("the compat bridge does not fetch image URLs; send the image itself")
        else:
            return _open_path(source)
    else:
        raw = bytes(source)
    if len(raw) > MAX_IMAGE_FILE_BYTES:
        raise CompatError("observation image is too large")
    try:
        pil = Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)
        if pil.width * pil.height > MAX_IMAGE_PIXELS:
            raise CompatError(f"observation of {pil.width}x{pil.height} pixels is over the limit")
        pil.load()
    except CompatError:
        raise
    except Exception as exc:
        raise CompatError(f"cannot decode the observation image: {type(exc).__name__}") from None
    return pil


def _open_path(path: str):
    """A server path a client named (sglang's image_path). Every way it fails gets one answer: told apart,
    a missing file, a protected one, a directory and a file that is no image said which server paths
    exist. The reason goes to the bridge's log."""
    try:
        return _open_image(_read_local_file(path))
    except CompatError as exc:
        log.info("observation image path %r refused: %s", path[:200], exc)
        raise CompatError(f"observation image path {path[:200]!r} is not a readable image file") from None


def observations(image_path: Any) -> tuple[np.ndarray, bool]:
    """uint8 [H, W, 3] for one observation, or [B, H, W, 3] and batched=True for B > 1 (sglang's
    Cosmos3 builder sends one image as itself and B > 1 images as a list)."""
    arrays, total = [], 0
    for item in _observation_list(image_path):
        arrays.append(image_to_rgb_array(item))
        total += arrays[-1].nbytes
        # Checked while decoding, before the stack doubles it: the scheduler refuses a group's observations
        # over this (convert.py), and a SUBMIT over its message limit makes it drop the bridge's one
        # connection, losing every other client's request in flight.
        if total > protocol.MAX_OBSERVATION_BYTES:
            raise CompatError(f"the observations decode to more than {protocol.MAX_OBSERVATION_BYTES} bytes "
                              "(the scheduler's limit for one request): send fewer or smaller images")
    if len(arrays) == 1:
        return arrays[0], False
    if any(a.shape != arrays[0].shape for a in arrays):
        raise CompatError("batched observation images must all have the same size")
    return np.stack(arrays), True
