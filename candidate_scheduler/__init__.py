"""candidate_scheduler: a serving scheduler for diffusion action generation.

One logical request asks for N stochastic candidate action trajectories from one observation; the
candidates run as one group (one physical batch, or microbatches when they do not fit), and are
reduced to one served action by a model-declared reducer. The layout is in docs/architecture.md.

The public Python API is `from candidate_scheduler import Client, AsyncClient` (and `synthetic_image`,
and the errors they raise: `SchedulerUnavailable`, `Forbidden`, `ServiceError`, `ClientClosed`).
They load lazily, so importing the pure rooms under `candidate_scheduler.core` never pulls in zmq.
"""

__version__ = "0.1.0"

_CLIENT_NAMES = ("Client", "ClientClosed", "Forbidden", "Result", "SchedulerUnavailable", "ServiceError",
                 "synthetic_image")
__all__ = ["AsyncClient", *_CLIENT_NAMES, "__version__"]


def __getattr__(name: str):
    if name == "AsyncClient":
        from candidate_scheduler.service.async_client import AsyncClient

        return AsyncClient
    if name in _CLIENT_NAMES:
        from candidate_scheduler.service import client

        return getattr(client, name)
    raise AttributeError(f"module 'candidate_scheduler' has no attribute {name!r}")
