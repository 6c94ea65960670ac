"""core.embodiments: domain_name / domain_id / raw_action_dim resolved the way sglang 0.5.23 resolves
them (the tables and wording are compared with the installed sglang in tests/compat/test_embodiments.py)."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.embodiments import (
    EMBODIMENT_TO_DOMAIN_ID,
    EMBODIMENT_TO_RAW_ACTION_DIM,
    NEED_NAME_OR_ID,
    NEED_RAW_ACTION_DIM,
    get_raw_action_dim,
    resolve_embodiment,
)
from tests.unit.fresh_imports import heavy_modules_loaded


def test_a_name_alone_gives_its_id_and_width():
    assert resolve_embodiment(None, "droid_lerobot", None) == (8, 10)
    assert resolve_embodiment(None, "agibotworld", None) == (15, 29)
    assert resolve_embodiment(None, "pusht", None) == (4, 2)


def test_names_are_matched_after_strip_and_lower():
    assert resolve_embodiment(None, "  DROID_LeRobot\n", None) == (8, 10)


def test_domain_id_wins_over_the_name_and_the_width_still_comes_from_the_name():
    assert resolve_embodiment(3, "droid_lerobot", None) == (3, 10)
    assert resolve_embodiment(3, "droid_lerobot", 7) == (3, 7)


def test_an_explicit_width_wins_over_the_names_width():
    assert resolve_embodiment(None, "droid_lerobot", 7) == (8, 7)


def test_a_name_without_a_known_width_needs_raw_action_dim():
    assert resolve_embodiment(None, "libero", 7) == (5, 7)
    with pytest.raises(ValueError) as exc:
        resolve_embodiment(None, "libero", None)
    assert str(exc.value) == (f"No raw action dim for Cosmos3 embodiment 'libero'. Expected one of "
                              f"{sorted(EMBODIMENT_TO_RAW_ACTION_DIM)}.")


def test_an_id_and_width_need_no_name():
    assert resolve_embodiment(0, None, 7) == (0, 7)
    assert resolve_embodiment(31, "", 7) == (31, 7)  # an empty name is no name


def test_unknown_name_gets_sglangs_wording():
    with pytest.raises(ValueError) as exc:
        resolve_embodiment(None, "r2d2", None)
    assert str(exc.value) == f"Unknown action domain name 'r2d2'. Valid names: {sorted(EMBODIMENT_TO_DOMAIN_ID)}"
    # with an id given, sglang never looks the name up for the id, only for a missing width
    assert resolve_embodiment(2, "r2d2", 7) == (2, 7)
    with pytest.raises(ValueError, match="No raw action dim for Cosmos3 embodiment 'r2d2'"):
        resolve_embodiment(2, "r2d2", None)


@pytest.mark.parametrize("args, message", [
    ((None, None, None), NEED_NAME_OR_ID),
    ((None, "", 7), NEED_NAME_OR_ID),
    ((0, None, None), NEED_RAW_ACTION_DIM),
    ((-1, None, 7), "domain_id must be non-negative, got -1"),
    ((0, None, 0), "raw_action_dim must be a positive int, got 0"),
    ((True, None, 7), "domain_id must be an int, got bool"),
    ((0, None, 7.0), "raw_action_dim must be an int, got float"),
    ((None, 8, None), "domain_name must be a string, got int"),
])
def test_refusals(args, message):
    with pytest.raises(ValueError) as exc:
        resolve_embodiment(*args)
    assert str(exc.value) == message


def test_every_named_width_belongs_to_a_named_domain():
    assert set(EMBODIMENT_TO_RAW_ACTION_DIM) <= set(EMBODIMENT_TO_DOMAIN_ID)
    assert all(get_raw_action_dim(name) == dim for name, dim in EMBODIMENT_TO_RAW_ACTION_DIM.items())


def test_core_embodiments_imports_nothing_heavy():
    heavy = ("torch", "zmq", "asyncio", "sglang", "msgspec", "numpy")
    assert heavy_modules_loaded(["candidate_scheduler.core.embodiments"], heavy) == []
