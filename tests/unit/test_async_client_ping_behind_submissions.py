"""AsyncClient's liveness and next-run PINGs, with a control endpoint, go to the control socket: on the
request socket they queued behind every SUBMIT sent before them, and a burst of big submissions over a
slow link held them past `liveness_s` while the scheduler was fine (a false SchedulerUnavailable).

The scheduler here is a stand-in over real ZMQ: its request socket is busy (it reads nothing, as while a
burst of MB images is still arriving) until its control socket has answered the PINGs the test waits
for; the control socket answers every PING at once."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import Client
from tests.unit.test_client_replies import result

IMAGE = np.zeros((8, 8, 3), np.uint8)
LIVENESS_S = 0.2


class BusyScheduler:
    """`release(pong, state)`: in how many seconds the request socket may be read again (None: not yet),
    asked after each PONG the control socket sends. `answer(msg, state)`: the replies to a SUBMIT;
    `state["busy"] = True` there makes the request socket busy again (until `release` says otherwise). The
    control socket answers STATUS too: "queued" for a group the request socket has read, else "unknown"."""

    def __init__(self, release, answer, busy: bool = True):
        self.ctx = zmq.Context.instance()
        self.request, self.request_endpoint = self._router()
        self.control, self.control_endpoint = self._router()
        self.state = {"incarnation": "A", "busy": busy, "control_pings": 0, "request_pings": 0, "submits": []}
        self._release, self._answer = release, answer
        self._readable, self._stop = threading.Event(), threading.Event()
        if not busy:
            self._readable.set()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._serve_request, self._serve_control)]
        for t in self._threads:
            t.start()

    def _router(self) -> tuple[zmq.Socket, str]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        return sock, f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"

    def _serve_control(self) -> None:
        while not self._stop.is_set():
            if not self.control.poll(20):
                continue
            ident, header, payload = self.control.recv_multipart()
            kind = protocol.parse_header(header, protocol.CONTROL_KINDS)
            msg = protocol.decode(kind, payload)
            if kind is protocol.Kind.STATUS:
                read = any(rid == msg.request_id for _run, rid in self.state["submits"])
                reply = protocol.ControlReply(True, state="queued" if read else "unknown")
                self.control.send_multipart([ident, *protocol.encode(protocol.Kind.CONTROL_REPLY, reply)])
                continue
            pong = protocol.Pong(msg.nonce, incarnation=self.state["incarnation"])
            self.control.send_multipart([ident, *protocol.encode(protocol.Kind.PONG, pong)])
            self.state["control_pings"] += 1
            in_s = self._release(pong, self.state) if self.state["busy"] else None
            if in_s is not None:
                timer = threading.Timer(in_s, self._make_readable)
                timer.daemon = True
                timer.start()

    def _make_readable(self) -> None:
        self.state["busy"] = False
        self._readable.set()

    def _serve_request(self) -> None:
        while not self._stop.is_set():
            if self.state["busy"]:
                self._readable.wait(0.02)
                continue
            if not self.request.poll(20):
                continue
            ident, header, payload = self.request.recv_multipart()
            kind = protocol.parse_header(header, protocol.REQUEST_KINDS)
            msg = protocol.decode(kind, payload)
            if kind is protocol.Kind.PING:
                self.state["request_pings"] += 1
                pong = protocol.Pong(msg.nonce, incarnation=self.state["incarnation"])
                self.request.send_multipart([ident, *protocol.encode(protocol.Kind.PONG, pong)])
                continue
            self.state["submits"].append((self.state["incarnation"], msg.request_id))
            for reply_kind, reply in self._answer(msg, self.state):
                self.request.send_multipart([ident, *protocol.encode(reply_kind, reply)])
            if self.state["busy"]:
                self._readable.clear()

    def close(self) -> None:
        self._stop.set()
        self._readable.set()
        for t in self._threads:
            t.join()
        self.request.close(0)
        self.control.close(0)


def test_a_group_behind_a_busy_request_socket_is_not_given_up_while_the_control_socket_answers():
    """The request socket reads nothing for 4 liveness PINGs (3 x liveness_s of silence, past the 2 x
    liveness_s bound), then answers the group. The PINGs went behind the SUBMIT on the request socket,
    unanswered: SchedulerUnavailable after 2 x liveness_s, from a scheduler that was only busy."""
    sched = BusyScheduler(release=lambda pong, state: 0.0 if state["control_pings"] >= 4 else None,
                          answer=lambda msg, state: [(protocol.Kind.RESULT, result(msg.request_id))])

    async def scenario():
        c = AsyncClient(sched.request_endpoint, liveness_s=LIVENESS_S, control=sched.control_endpoint)
        try:
            return await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="big"), 10)
        finally:
            c.close()

    try:
        r = asyncio.run(scenario())
        assert (r.request_id, r.status, r.resent) == ("big", "done", [])
        assert sched.state["control_pings"] >= 4  # the client did probe, on the control socket
        assert sched.state["submits"] == [("A", "big")]
    finally:
        sched.close()


def test_the_next_run_is_found_over_the_control_socket_while_the_request_socket_is_busy():
    """Run A answers the group `shutting_down` (it is stopping), and run B is up at once; the request
    socket is busy again (the resends of every other robot) until a PING has been answered by B. The
    client's next-run PINGs went behind them on the request socket, and it never found B."""

    def answer(msg, state):
        if len(state["submits"]) == 1:
            state["incarnation"], state["busy"] = "B", True
            return [(protocol.Kind.RESULT, result(msg.request_id, "failed", "shutting_down"))]
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    sched = BusyScheduler(release=lambda pong, state: 0.0 if pong.incarnation == "B" else None, answer=answer,
                          busy=False)

    async def scenario():
        c = AsyncClient(sched.request_endpoint, liveness_s=LIVENESS_S, control=sched.control_endpoint)
        try:
            return await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="g", resubmit=True), 5)
        finally:
            c.close()

    try:
        r = asyncio.run(scenario())
        assert (r.status, r.resent) == ("done", ["shutting_down"])
        assert sched.state["submits"] == [("A", "g"), ("B", "g")]
    finally:
        sched.close()


def _switch_to_b_then_release_later(pong, state):
    """The first PING is answered by run A, every later one by run B, which reads its request socket
    0.1 s after its first PONG: the client's SUBMIT, sent to A as far as it knew, was queued by ZMQ while
    the request connection came back, and reaches B then."""
    state["incarnation"] = "B"
    return 0.1 if pong.incarnation == "B" else None


def _answer_done(msg, state):
    return [(protocol.Kind.RESULT, result(msg.request_id))]


def test_an_async_group_b_is_about_to_read_is_not_given_up_as_restarted():
    """A PONG on the control socket says B, the STATUS asked at once too, before B has read the SUBMIT
    still on its way on the request socket: "unknown", given up as `restarted`. A PING on the request
    socket, which comes back behind the SUBMIT, goes first now."""
    sched = BusyScheduler(release=_switch_to_b_then_release_later, answer=_answer_done)

    async def scenario():
        c = AsyncClient(sched.request_endpoint, liveness_s=1.0, control=sched.control_endpoint)
        try:
            return await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="g"), 10)
        finally:
            c.close()

    try:
        r = asyncio.run(scenario())
        assert (r.status, sched.state["submits"]) == ("done", [("B", "g")])
    finally:
        sched.close()


def test_a_blocking_group_b_is_about_to_read_is_not_given_up_as_restarted():
    """As above, for the blocking Client: its PINGs went to the control socket already, and so did this."""
    sched = BusyScheduler(release=_switch_to_b_then_release_later, answer=_answer_done)
    try:
        with Client(sched.request_endpoint, sched.control_endpoint, liveness_s=1.0) as c:
            r = c.submit(IMAGE, "pick", request_id="g", timeout_s=10)
        assert (r.status, sched.state["submits"]) == ("done", [("B", "g")])
    finally:
        sched.close()


def test_a_second_answer_from_a_stopping_run_is_not_taken_as_the_next_runs():
    """As test_client_replies.py's test of the same name, for AsyncClient with a control endpoint: run A,
    paused past the liveness verdict, gets the group and its resend, then stops and answers both
    `shutting_down`. The client takes the first and finds run B with PINGs on the control socket, so
    nothing read its request socket meanwhile (its reader runs while something is awaited there): A's
    second answer waited there, and was taken as the answer to the resend to B."""
    from tests.unit.test_client_replies import Played

    class MutedFor:
        """Played's `mute`, asked once a PING: true for the first `n` (the run is paused), then false."""

        def __init__(self, n: int):
            self.n = n

        def __bool__(self) -> bool:
            self.n -= 1
            return self.n >= 0

    def answer(msg, state):
        n = len(state["submits"])
        if n == 1:  # paused: the liveness PING and the first next-run PING go unanswered, the client gives up
            state["mute"] = MutedFor(2)
            return []
        if n == 2:  # the resend reached the same run, which now stops: both SUBMITs answered
            state["incarnation"] = "B"  # and the next run is up on the same address
            return [(protocol.Kind.RESULT, result(msg.request_id, "failed", "shutting_down"))] * 2
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)  # answers PINGs from any socket: the request socket and the control one alike

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=LIVENESS_S, control=played.endpoint)
        try:
            r = await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="g", resubmit=True), 10)
            return r, await c.ping(1), c._futures
        finally:
            c.close()

    try:
        r, answered, awaited = asyncio.run(scenario())
        assert (r.status, r.resent) == ("done", ["unavailable", "shutting_down"]), played.state["submits"]
        assert answered and awaited == {}
    finally:
        played.close()
