import sys

from candidate_scheduler.bench.cli import build_parser, main

sys.exit(main(build_parser().parse_args()))
