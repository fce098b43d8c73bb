# The two set-up commands a newcomer runs are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXT_SOURCES := $(wildcard fastio/*.pyx fastio/*.pxd fastio/csrc/*.c fastio/csrc/*.h) setup.py
EXT := fastio/.built

.PHONY: demo demo-s3 test bench build clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Build tools first, then the project without build isolation so the pinned Cython builds it.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt pip setuptools wheel Cython
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-build-isolation -e '.[test]'
	touch $@

$(EXT): $(STAMP) $(EXT_SOURCES)
	$(BIN)/python setup.py --quiet build_ext --inplace
	touch $@

build: $(EXT)

demo: build
	$(BIN)/ckptbench demo

# The same demo served by a local S3 server (moto on 127.0.0.1 behind a latency-shaping proxy).
demo-s3: build
	$(BIN)/ckptbench demo --s3

# One worker more than the 2 cores CI and this box have: with two, 13 % of the cores' time sat idle (tests wait on
# their subprocesses, the local S3, torchrun's rendezvous), and three ran the suite in 12:05 against 14:38.
TEST_WORKERS ?= 3

# The terminal test drives the TUI inside tmux, the benchmark's fio replay is checked against fio, and the FUSE
# tests mount the local S3 with s3fs; all come from the distribution's packages.
test: build
	@command -v tmux >/dev/null && command -v fio >/dev/null && command -v s3fs >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq tmux fio s3fs; } \
		|| { echo "make test needs tmux, fio and s3fs: apt-get install tmux fio s3fs"; exit 2; }
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not alone"
	$(BIN)/python -m pytest -q -m alone

# The peers (Run:ai Model Streamer, fastsafetensors) come with the bench-only extra, installed here.
bench: build
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-build-isolation -e '.[test,bench]'
	@command -v fio >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq fio); } || true
	$(BIN)/python bench/read_bench.py
	$(BIN)/python bench/restore_bench.py
	$(BIN)/python bench/s3_bench.py
	$(BIN)/python bench/peers_bench.py
	$(BIN)/python bench/dcp_bench.py
	$(BIN)/python bench/save_bench.py
	$(BIN)/python bench/watch_bench.py
	$(BIN)/python bench/dist_bench.py

clean:
	rm -rf build $(VENV) fastio/_engine.c fastio/*.so $(EXT) *.egg-info

# The compat tier's fixtures, written by the training libraries themselves (their newest releases, in their own venv
# on the CPU torch from disk), then the tier run against them; `make test` runs it from the committed fixtures.
COMPAT_VENV := .venv-compat
.PHONY: compat
compat: build
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(COMPAT_VENV)/bin/python -m pip install --quiet --upgrade transformers accelerate lightning peft megatron-core \
		torchtitan safetensors numpy
	DS_BUILD_OPS=0 $(COMPAT_VENV)/bin/python -m pip install --quiet --upgrade --no-build-isolation deepspeed
	DS_ACCELERATOR=cpu $(COMPAT_VENV)/bin/python tests/compat/make_fixtures.py
	$(BIN)/python -m pytest -q tests/compat
