"""The benchmarks behind `make bench` (results in bench/results/)."""
