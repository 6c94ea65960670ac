"""The pure rooms: the candidate contract, seeds, reducers, admission, planning, group state and the
scheduling engine. Nothing here opens a socket, runs an event loop, reads a clock or imports torch,
sglang, zmq or msgspec (tests/unit/test_purity.py checks it), so every decision is testable in process."""
