"""The engine's settings: what a `serve` command line fixes for the life of a scheduler (commands.py)."""

from __future__ import annotations

from dataclasses import dataclass

from candidate_scheduler.core.admission import AdmissionPolicy
from candidate_scheduler.core.margins import check_margin_quantile
from candidate_scheduler.core.resubmission import DEFAULT_REPLIES_KEPT, DEFAULT_REPLIES_KEPT_BYTES
from candidate_scheduler.core.tenants import TenantPolicy

BATCHING_MODES = ("dispatch", "step")


@dataclass
class EngineConfig:
    policy: AdmissionPolicy = AdmissionPolicy.MICROBATCH
    batching: str = "dispatch"
    max_queued_groups: int = 1024
    retry_limit: int = 3  # attempts per slice, the first one included
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 3.0
    finished_memory: int = 10_000  # finished groups remembered for STATUS
    replies_kept: int = DEFAULT_REPLIES_KEPT  # the last replies a resubmission is answered from
    replies_kept_bytes: int = DEFAULT_REPLIES_KEPT_BYTES  # and the most their arrays may weigh together
    best_effort_s: float = 30.0  # a group without a deadline is ordered as if due this long after receipt
    margin_quantile: float = 0.9  # of the measured prediction error that deadline forecasts plan for
    # Batches' worth of work a worker may hold beyond what it runs: its next batch (dispatch) or rows
    # beyond its capacity (step) wait on the worker and start at the first step boundary with room, not
    # a round trip later. 0: a worker gets work only when it can start it.
    prefetch: int = 1
    # Late prefetch (core/snapshot.py): that work is sent this long before the worker is predicted to need
    # it, not as soon as it has room, so a group arriving meanwhile may still go ahead of it. inf: at once.
    prefetch_lead_s: float = 0.01
    tenants: tuple[TenantPolicy, ...] = ()  # limits and weights by tenant (core/tenants.py)
    fair_queueing: bool = True  # best-effort groups ordered fairly across tenants, not by receipt
    stagger: bool = True  # idle workers start one after another behind a deep backlog (core/stagger.py)

    def __post_init__(self) -> None:
        self.policy = AdmissionPolicy(self.policy)
        check_margin_quantile(self.margin_quantile)
        if not isinstance(self.prefetch, int) or not 0 <= self.prefetch <= 4:
            raise ValueError(f"prefetch must be an int in [0, 4], got {self.prefetch!r}")
        if not isinstance(self.prefetch_lead_s, (int, float)) or not self.prefetch_lead_s >= 0:
            raise ValueError(f"prefetch_lead_s must be a number of seconds >= 0 (inf: at once), "
                             f"got {self.prefetch_lead_s!r}")
        if not 0 < self.heartbeat_interval_s < self.heartbeat_timeout_s:  # NaN too
            # a worker beats once an interval and is taken for dead after the timeout without a word: at or
            # below the interval every worker would be dropped between its beats, again and again
            raise ValueError(f"the heartbeat interval ({self.heartbeat_interval_s!r} s) must be above 0 and below "
                             f"the heartbeat timeout ({self.heartbeat_timeout_s!r} s)")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
