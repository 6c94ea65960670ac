"""Images of no pixels: refused by the openpi front, whatever their dtype (the scheduler takes them)."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.service.openpi import observation


@pytest.mark.parametrize("shape", [(0, 5, 3), (5, 0, 3), (3, 0, 0)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_an_image_of_no_pixels_is_refused_for_every_dtype(shape, dtype):
    # a float one was refused ("is empty"); a uint8 one went to the scheduler, whose check
    # (core/request.py) is only of the channels and the observation count
    with pytest.raises(observation.ObservationError, match="is empty"):
        observation.translate({"observation/image": np.zeros(shape, dtype)}, observation.FrontDefaults(), "r")
