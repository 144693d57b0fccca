# nocloud.loadbalancer — every command a user or CI needs.
#   make test   runs every test and check (installs what it needs; run as root)
#   make lab    builds the local lab and runs site.yml on it
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= $(CURDIR)/.venv
BIN := $(VENV)/bin
PY := $(BIN)/python
export PATH := $(BIN):$(PATH)
# Debian packages the tests and the lab need on the controller.
APT_PACKAGES := debootstrap iproute2 iputils-ping arping tcpdump nftables curl ndisc6 keepalived rsync shellcheck

.PHONY: help deps venv lint unit sanity netns labtests molecule test lab lab-down bench bench-failover build clean fuzz fuzz-long

help:
	@echo "make test   - install what is needed, then run lint, unit, sanity, namespace and molecule tests"
	@echo "make lab    - build the lab (namespaces + systemd hosts) and run site.yml on it"
	@echo "make bench  - run the benchmarks and print their figures"

deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

$(VENV)/.stamp: requirements-dev.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -e .
	touch $@

venv: $(VENV)/.stamp

lint: venv
	$(BIN)/ruff check plugins speaker tests benchmarks roles/lab/files molecule
	$(BIN)/mypy plugins/module_utils speaker/nocloudlb
	$(BIN)/antsibull-changelog lint
	scripts/collection-tree.sh ansible-lint

unit: venv
	$(BIN)/pytest tests/unit -q -p no:cacheprovider

sanity: venv
	scripts/collection-tree.sh sanity

netns: deps venv
	$(BIN)/pytest tests/netns -q -p no:cacheprovider

labtests: deps venv
	$(BIN)/pytest tests/lab -q -p no:cacheprovider

molecule: deps venv
	molecule test -s lab
	molecule test -s default
	molecule test -s edges

test: deps venv lint unit fuzz sanity netns labtests molecule

# Bounded fuzzing (issue 8): ARP/NDP frames, gossip metadata, control requests, config files; under 1.5 min.
fuzz: venv
	$(BIN)/pytest tests/fuzz -q -p no:cacheprovider

# The long run (docs/fuzzing.md): 1,000,000 frames and 5,000 examples per input; about 35 min.
fuzz-long: venv
	FUZZ_FRAMES=1000000 FUZZ_EXAMPLES=5000 FUZZ_SEED=$${FUZZ_SEED:-$$RANDOM} $(BIN)/pytest tests/fuzz -q -s -p no:cacheprovider

# The lab of the default scenario (three nodes, two clients, a router), site.yml
# deployed on it, then the scenario's verify: who answers ARP/NDP for each VIP,
# HTTP through every VIP, and the VIPs moving under kill -9, freeze, link down and
# drain, with the measured times. The lab stays up for you to explore
# (docs/lab.md); `make lab-down` removes it.
lab: deps venv
	molecule converge -s default
	molecule verify -s default

lab-down: venv
	molecule destroy -s default

bench: deps venv
	$(PY) benchmarks/core_bench.py
	$(PY) benchmarks/arp_latency.py -n 500
	$(PY) benchmarks/handover.py --cycles 5

# About 8 minutes: 20 kill -9 per profile, keepalived beside the speaker.
bench-failover: deps venv
	$(PY) benchmarks/failover.py --kills 20 --keepalived

build: venv
	$(BIN)/ansible-galaxy collection build --force --output-path dist .

clean:
	rm -rf dist build tests/output .mypy_cache .ruff_cache .pytest_cache
