"""Cosmos3 embodiments: which domain id and raw action width a request means, resolved the way
sglang 0.5.23 resolves them.

sglang users name the robot (``domain_name="droid_lerobot"``) instead of giving ``domain_id`` and
``raw_action_dim``. The tables and rules are sglang's, vendored so that the scheduler and the compat
bridge never import sglang (tests/compat/test_embodiments.py checks them against the installed copy):

- ``EMBODIMENT_TO_DOMAIN_ID``, ``EMBODIMENT_TO_RAW_ACTION_DIM`` and ``get_raw_action_dim``:
  ``runtime/pipelines_core/stages/model_specific_stages/cosmos3_action.py``;
- ``domain_id`` wins over ``domain_name`` for the id; a name is looked up after ``strip().lower()``:
  ``Cosmos3LatentPreparationStage._resolve_domain_id`` (``.../cosmos3.py``);
- ``raw_action_dim`` comes from the name when it is not given (same stage, ``_prepare_action_latents``);
- a request needs a name or an id, and an id alone needs ``raw_action_dim``:
  ``runtime/entrypoints/action/cosmos3.py::build_cosmos3_action_sampling_params``.

Error texts are sglang's own, so a client sees the same message from either server.
"""

from __future__ import annotations

EMBODIMENT_TO_DOMAIN_ID: dict[str, int] = {
    "no_action": 0,
    "av": 1,
    "camera_pose": 2,
    "hand_pose": 3,
    "pusht": 4,
    "libero": 5,
    "umi": 6,
    "bridge_orig_lerobot": 7,
    "droid_lerobot": 8,
    "robomind-franka": 8,
    "galbot": 9,
    "robomind-franka-dual": 12,
    "robomind-ur": 13,
    "agibotworld": 15,
    "agibot_gear_gripper": 15,
    "agibot_gear_gripper_ext": 15,
    "fractal": 20,
}

# Real (unpadded) action channels per embodiment; the model pads up to its action_dim. Several named
# domains (no_action, hand_pose, libero, galbot, the agibot grippers) have no entry in sglang either:
# they need an explicit raw_action_dim.
EMBODIMENT_TO_RAW_ACTION_DIM: dict[str, int] = {
    "av": 9,
    "camera_pose": 9,
    "pusht": 2,
    "umi": 10,
    "bridge_orig_lerobot": 10,
    "droid_lerobot": 10,
    "robomind-franka": 10,
    "robomind-franka-dual": 20,
    "robomind-ur": 10,
    "agibotworld": 29,
    "fractal": 10,
}

NEED_NAME_OR_ID = "Cosmos3 action requests require domain_name or domain_id"
NEED_RAW_ACTION_DIM = "raw_action_dim is required when only domain_id is provided"


def get_raw_action_dim(embodiment: str) -> int:
    key = embodiment.lower().strip()
    if key not in EMBODIMENT_TO_RAW_ACTION_DIM:
        raise ValueError(
            f"No raw action dim for Cosmos3 embodiment {embodiment!r}. Expected one "
            f"of {sorted(EMBODIMENT_TO_RAW_ACTION_DIM)}."
        )
    return EMBODIMENT_TO_RAW_ACTION_DIM[key]


def domain_id_for_name(domain_name: str) -> int:
    key = str(domain_name).strip().lower()
    if key not in EMBODIMENT_TO_DOMAIN_ID:
        raise ValueError(f"Unknown action domain name {domain_name!r}. Valid names: {sorted(EMBODIMENT_TO_DOMAIN_ID)}")
    return EMBODIMENT_TO_DOMAIN_ID[key]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_embodiment(domain_id: int | None, domain_name: str | None,
                       raw_action_dim: int | None) -> tuple[int, int]:
    """(domain_id, raw_action_dim) for a Cosmos3 action request, as sglang resolves them.

    Raises ValueError with sglang's wording: neither a name nor an id; an id alone without
    raw_action_dim; an unknown name (when the id is not given); a name without a known width (when
    raw_action_dim is not given). An empty name counts as no name, as in sglang. The upper bound of
    raw_action_dim is the model's action_dim, which only the worker knows."""
    if domain_id is not None and not _is_int(domain_id):
        raise ValueError(f"domain_id must be an int, got {type(domain_id).__name__}")
    if domain_name is not None and not isinstance(domain_name, str):
        raise ValueError(f"domain_name must be a string, got {type(domain_name).__name__}")
    if raw_action_dim is not None and not _is_int(raw_action_dim):
        raise ValueError(f"raw_action_dim must be an int, got {type(raw_action_dim).__name__}")
    if domain_id is None and not domain_name:
        raise ValueError(NEED_NAME_OR_ID)
    if domain_id is not None and not domain_name and raw_action_dim is None:
        raise ValueError(NEED_RAW_ACTION_DIM)
    if domain_id is not None:
        if domain_id < 0:
            raise ValueError(f"domain_id must be non-negative, got {domain_id}")
        resolved_id = domain_id
    else:
        resolved_id = domain_id_for_name(domain_name)
    if raw_action_dim is None:
        raw_action_dim = get_raw_action_dim(domain_name)
    if raw_action_dim < 1:
        raise ValueError(f"raw_action_dim must be a positive int, got {raw_action_dim}")
    return resolved_id, raw_action_dim
