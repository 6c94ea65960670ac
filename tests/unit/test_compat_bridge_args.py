"""The compat bridge's command line refuses values that would make it refuse or time out everything."""

from __future__ import annotations

import pytest

from candidate_scheduler.compat.bridge import build_parser


@pytest.mark.parametrize("argv", [["--request-timeout", "0"], ["--request-timeout", "-1"],
                                  ["--request-timeout", "nan"], ["--max-message-bytes", "0"],
                                  ["--max-message-bytes", "-1"]])
def test_bad_limits_are_refused_at_the_command_line(argv, capsys):
    # --request-timeout 0 / -1 answered every request "no result within" at once; --max-message-bytes -1
    # lifted ZMQ's size limit (MAXMSGSIZE -1) while the unpickler refused every payload
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


def test_good_limits_parse():
    args = build_parser().parse_args(["--request-timeout", "2.5", "--max-message-bytes", "1024"])
    assert (args.request_timeout, args.max_message_bytes) == (2.5, 1024)
    assert build_parser().parse_args([]).request_timeout is None
