"""Medoid ties go to the lowest candidate id, whatever order each candidate's distances are summed in."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core.reducers import PartialReduction, reduce_full

_coord = st.floats(-10.0, 10.0, allow_nan=False, width=32)


def _mirror(a, b, y0, y1):
    # candidates 1 and 2 (and 0 and 3) are mirror images: their distances to the others are bitwise equal,
    # listed in a different candidate order
    return np.array([[-a, y0], [-b, y1], [b, y1], [a, y0]], dtype=np.float32)


def test_mirror_image_tie_goes_to_the_lowest_id():
    # a left-to-right sum of the same distances in another order came out one ulp smaller for candidate 2
    cands = np.array([[-8.633157730102539, -1.2017287015914917], [-5.4191975593566895, -0.4638766646385193],
                      [5.4191975593566895, -0.4638766646385193], [8.633157730102539, -1.2017287015914917]],
                     dtype=np.float32)
    r = reduce_full("medoid", cands)
    assert r.chosen_candidate == 1
    np.testing.assert_array_equal(r.action, cands[1])


@settings(max_examples=200, deadline=None)
@given(st.floats(0.125, 10.0, width=32), st.floats(0.125, 10.0, width=32), _coord, _coord)
def test_exact_ties_never_go_to_a_higher_id(a, b, y0, y1):
    a, b = max(a, b), min(a, b)
    cands = _mirror(a, b, y0, y1)
    r = reduce_full("medoid", cands)
    assert r.chosen_candidate in (0, 1)  # 3 ties 0 and 2 ties 1 exactly; the lower id of a tie wins
    partial = PartialReduction("medoid", 4)
    partial.fold([3, 1], cands[[3, 1]])
    partial.fold([2, 0], cands[[2, 0]])
    np.testing.assert_array_equal(partial.finalize(), r.action)
    assert partial.chosen_candidate == r.chosen_candidate
