# make demo: set up and tune mm 1x4096x4096 fp32 on this CPU (16 measured trials; a decode-like GEMM, x @ W with
#            W stored [K, N]: an nn.Linear's weight is [N, K], weight_layout=nk, another lookup key)
# make test: set up (Python packages; Debian's chromium and postgresql-15 for the tests) and run the whole
#            test suite (the slow end-to-end tests included), two tests at a time (pytest-xdist; most
#            tests wait on single-threaded compiles or subprocesses; handed out in order, the slow ones
#            first, at most two pending per worker: tests/conftest.py), then the tests marked `load`
#            (they start busy loops) alone
.PHONY: setup system-deps demo test lint

setup:
	bash scripts/setup.sh

# Debian packages the tests need (chromium for the HTML report, postgresql-15 for the database tests)
system-deps:
	bash scripts/system_deps.sh

demo: setup
	.venv/bin/python -m zhantune +op=mm shape=[1,4096,4096] dtype=float32 device=cpu search.n_trials=16

# the tests that make their own load run alone afterwards: their busy loops would slow the others; both
# parts share one Inductor cache directory of their own, deleted at the end (tests/conftest.py). The
# second part collects only the files that mark a test `load` (collecting all of them took 9 s)
test: setup system-deps
	dir=$$(mktemp -d -t zhantune-tests-inductor-XXXXXX) && export ZHANTUNE_TESTS_CACHE_DIR=$$dir && \
	.venv/bin/python -m pytest -v -n 2 --dist load --maxschedchunk 1 --durations=15 -m "not load" && \
	.venv/bin/python -m pytest -v --durations=5 -m load $$(grep -l "pytest.mark.load" tests/test_*.py); \
	rc=$$?; rm -rf "$$dir"; exit $$rc

lint: setup
	.venv/bin/ruff check zhantune tests scripts
