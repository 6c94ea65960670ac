"""The one contract error type.

Every rejection of caller input (a spec, a capability, a seed, an admission) raises or carries a
`CandidateContractError`. It subclasses ValueError so generic handlers still catch it, and it carries a
stable machine `code` (safe as a metric label or a wire error code) plus the offending `field`, so a
reply can point at the exact input that was wrong.
"""

from __future__ import annotations

from typing import Any

# The bounded set of codes. Kept closed so codes can be metric label values and so clients can switch
# on them; add a code here before raising it anywhere.
ERROR_CODES = frozenset(
    {
        "invalid_type",
        "invalid_value",
        "invalid_count",
        "invalid_seed",
        "seeds_length",
        "seed_policy",
        "unknown_field",
        "unknown_reducer",
        "reducer_exists",
        "bad_reducer_output",
        "count_over_limit",
        "unsupported_action_mode",
        "does_not_fit",
        "unknown_candidate",
        "duplicate_candidate",
        "incomplete_group",
        "candidate_mismatch",
        "shape_mismatch",
        "non_finite",
        "bad_snapshot",
    }
)

_UNSET = object()


class CandidateContractError(ValueError):
    """A caller broke the candidate contract.

    `field` names the offending input (e.g. "count", "seeds[3]"), `code` is a member of ERROR_CODES,
    `value` is the bad value when one exists. The message always names the field and the value.
    """

    def __init__(self, field: str, code: str, detail: str, value: Any = _UNSET) -> None:
        if code not in ERROR_CODES:
            # A typo in a code would silently create a new metric label; fail where it is written.
            raise AssertionError(f"unknown error code {code!r}")
        self.field = field
        self.code = code
        self.detail = detail
        self.value = None if value is _UNSET else value
        shown = "" if value is _UNSET else f" (got {_short_repr(value)})"
        super().__init__(f"{field}: {detail}{shown}")
        # Keep the constructor arguments so the exception pickles and copies faithfully.
        self._init_args = (field, code, detail) if value is _UNSET else (field, code, detail, value)

    def __reduce__(self):  # noqa: D105 - pickling support for the custom __init__
        return (type(self), self._init_args)

    def to_dict(self) -> dict[str, str]:
        """The wire form of the error: a plain map of strings."""
        return {"code": self.code, "field": self.field, "message": str(self)}


def _short_repr(value: Any, limit: int = 120) -> str:
    # Error text ends up in logs and replies; a huge seed list must not make a huge message.
    try:
        text = repr(value)
    except ValueError:  # an int over 4300 digits (sys.set_int_max_str_digits): said by its size
        bits = value.bit_length() if isinstance(value, int) else None
        text = f"<an int of {bits} bits>" if bits is not None else f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
