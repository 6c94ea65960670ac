"""`worker --call-rows` as a value (worker/call_rows.py): anything but auto, all or a whole number of rows
of at least one is a ValueError, whoever hands it over (the CLI gives strings; a benchmark or a test
may give numbers)."""

from __future__ import annotations

import pytest

from candidate_scheduler.worker import call_rows


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), True, False, 2.5, 0, -1, "0", "x", ""])
def test_what_is_not_a_number_of_rows_is_a_value_error(value):
    with pytest.raises(ValueError, match="call rows must be"):
        call_rows.parse(value)


@pytest.mark.parametrize(("value", "rows"), [("auto", "auto"), ("all", None), (None, None), ("2", 2), (2, 2), (2.0, 2)])
def test_what_is_one_is_read_as_it(value, rows):
    assert call_rows.parse(value) == rows
