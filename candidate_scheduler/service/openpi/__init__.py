"""openpi's policy websocket in front of candidate_scheduler (robot clients: `openpi-client`).

- `front.py`: the websocket server (IO only: each observation is one native group).
- `observation.py`: observation dict -> SubmitRequest, native result -> reply (pure).
- `msgpack_numpy.py`: openpi's msgpack-numpy format, decoded without trust.
- `launch.py`: the command line, and `spawn_openpi_front` for `serve` / `up`.

Run it with ``python -m candidate_scheduler.service.openpi --scheduler-request tcp://... --port 8000``.
It never imports sglang or torch.
"""
