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
# conntrackd (FTFW sync) and conntrack for the connection-survival tests (tests/netns/conn_survival.py).
APT_PACKAGES += conntrackd conntrack
# Graphviz renders docs/images (scripts/pictures.py). promtool (Debian: prometheus) is used
# by the monitoring tests when present; not installed here, as it starts a server.
APT_PACKAGES += graphviz
# socat: the own-hosts test's ssh jump into the lab (tests/install/own_hosts.py).
APT_PACKAGES += socat

.PHONY: help deps venv router-tools lint unit fuzz fuzz-long sanity netns labtests molecule install-test own-hosts-test lab-images docs-check test lab lab-down bench bench-long bench-failover bench-side-by-side build clean chaos chaos-short chaos-partitions soak-bgp molecule-bgp-gobgp

help:
	@echo "make test   - install what is needed, then run lint, unit, sanity, namespace and molecule tests"
	@echo "make lab    - build the lab (namespaces + systemd hosts) and run site.yml on it"
	@echo "make bench  - run the benchmarks and print their figures"
	@echo "make bench-long - membership (3-80 speakers) and site.yml (10-1,000 services) at size; writes docs/images"
	@echo "make chaos  - every chaos fault on the lab; writes docs/chaos.md and docs/images/chaos-timeline.png"
	@echo "make soak-bgp - BGP failing closed at length: frr-reload failing 60 s, 100 drains as the session comes up"
	@echo "make molecule-bgp-gobgp - the BGP matrix's GoBGP column (nodes on FRR 8.4 and 10.3, GoBGP 3.10); about 6 min"
	@echo "make chaos-partitions - the partition matrix (fast and lan); writes its block of docs/chaos.md"

deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	if [[ " $$missing " == *" conntrackd "* ]] && systemctl is-system-running >/dev/null 2>&1; then \
		systemctl disable --now conntrackd.service >/dev/null 2>&1 || true; fi  # the tests run their own, in namespaces

$(VENV)/.stamp: requirements-dev.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -e .
	touch $@

# The checkout is the collection nocloud.loadbalancer for commands run from here (ansible.cfg's
# collections_path), so that playbooks run by FQCN as from an installed copy (docs/quickstart.md).
venv: $(VENV)/.stamp
	@mkdir -p .lab/collections/ansible_collections/nocloud
	@ln -sfn ../../../.. .lab/collections/ansible_collections/nocloud/loadbalancer

lint: venv
	$(BIN)/ruff check plugins speaker tests benchmarks roles/lab/files molecule scripts
	$(BIN)/mypy plugins/module_utils speaker/nocloudlb
	$(BIN)/antsibull-changelog lint
	scripts/collection-tree.sh ansible-lint

# The routers' own config checkers for the router role's tests (bird -p, gobgpd --dry-run, vtysh --dryrun):
# Debian's bird2, gobgpd and frr unpacked into .cache/routers, never installed (scripts/fetch-router-tools.sh).
router-tools:
	scripts/fetch-router-tools.sh

# The unit tests wait more than they compute (threads, timers, ansible subprocesses): three
# pytest-xdist workers, a test file each at a time, take under half the time of one.
UNIT_WORKERS ?= 3
unit: venv router-tools
	$(BIN)/pytest tests/unit -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist loadfile

sanity: venv
	scripts/collection-tree.sh sanity

# Two workers, a test file each at a time: every segment's namespaces carry a prefix of their own
# (tests/netns/netns.py), and the tests mostly wait for timers, so two files share the cores well.
NETNS_WORKERS ?= 2
netns: deps venv
	$(BIN)/pytest tests/netns -q -p no:cacheprovider -n $(NETNS_WORKERS) --dist loadfile

# Two workers, a test file each at a time: each worker boots its own shared lab ("pyt0", "pyt1"),
# every other lab in tests/lab has a name of its own; 4 m 23 s instead of 7 m 40 s.
LAB_WORKERS ?= 2
labtests: deps venv
	$(BIN)/pytest tests/lab -q -p no:cacheprovider -n $(LAB_WORKERS) --dist loadfile

# One step per scenario, so the final table shows each one's time.
SCENARIOS := lab default edges keepalived dataplane bgp
molecule: $(addprefix molecule-,$(SCENARIOS))

molecule-%: deps venv
	molecule test -s $*

# The default scenario runs as the README tells a new user: `make lab` (molecule converge and
# verify, then the summary of VIPs answered and moved), its idempotence, then `make lab-down`.
molecule-default: deps venv
	molecule destroy -s default >/dev/null 2>&1 || true
	molecule syntax -s default
	$(MAKE) lab && molecule idempotence -s default; rc=$$?; $(MAKE) lab-down; exit $$rc

# The collection as users install it: Galaxy tarball, ansible-galaxy install (tarball
# and requirements.yml) into an infra repo of its own with ansible-core only, lab
# `fh` deployed from there (tests/install/run.sh).
install-test: deps venv
	tests/install/run.sh

# docs/own-hosts.md executed as written by a controller user without root, over SSH (sudo), to
# Debian 13 and Debian 12 nodes the collection did not build (tests/install/own_hosts.py).
own-hosts-test: deps venv
	$(PY) tests/install/own_hosts.py

# The lab's base images (Debian 12 and 13), built once; `make test` builds them beside the unit
# tests so that the steps which boot labs find them ready.
lab-images: deps venv
	$(PY) roles/lab/files/labctl.py image
	$(PY) roles/lab/files/labctl.py image --release trixie

# docs/reference/ is generated from meta/argument_specs.yml and the modules' docs
# (scripts/gen-reference.py), docs/images/ by scripts/pictures.py: both must be current.
docs-check: deps venv
	$(PY) scripts/gen-reference.py --check
	$(PY) scripts/pictures.py --check

# Each step runs as `make STEP` through scripts/run-steps.py, which ends with a
# table of what ran, passed and took how long (the steps' output streams as it comes).
# `unit+lab-images+sanity+lint+docs-check+fuzz` run side by side, two at a time, on two cores
# (the image builds mostly wait on the mirror and the disk); `install-test+own-hosts-test` run side
# by side too (two labs of their own, mostly waiting on ssh, systemd and drains), and so do the edges and
# dataplane scenarios (2 m 40 s together instead of about 3 m), the lab role's scenario beside the default
# one (labs of their own, "mol" and "l2"). chaos-short runs beside labtests: its lab mostly waits on
# timers (114 CPU-seconds in 162 s alone; labtests 362 in 263 s), its goals have seconds of margin, and
# the pair took 5 m 02 s instead of 7 m 04 s one after the other. keepalived and bgp run one after the
# other: each keeps both cores busy (Ansible), so side by side they took 11 m 26 s against about 6 m
# each alone, and the load stalled a `fast`-profile speaker past its 100 ms suspicion time at a reload
# (the keepalived migration then saw a second MAC for 0.5 s, in two CI runs).
# ansible-test sanity installs its tools into virtualenvs of its own (~/.ansible/test/venv), never into
# the one unit runs from.
TEST_STEPS := unit+lab-images+sanity+lint+docs-check+fuzz netns labtests+chaos-short install-test+own-hosts-test \
	molecule-lab+molecule-default molecule-edges+molecule-dataplane molecule-keepalived molecule-bgp
test: deps venv
	$(PY) scripts/run-steps.py --title "make test" $(TEST_STEPS)

# The BGP matrix's GoBGP column (docs/bgp.md, "Routers and FRR releases, measured"), outside
# make test: gobgpd comes from the Debian package router-tools unpacks (copied into the router).
molecule-bgp-gobgp: deps venv router-tools
	molecule test -s bgp-gobgp

# BGP failing closed at length (docs/bgp.md, "Failing closed"): frr-reload --reload failing for
# 60 s after a withdrawal, and 100 drains right after the session comes up; about 12 min.
soak-bgp: deps venv
	NOCLOUDLB_RELOAD_FAIL_SECONDS=60 NOCLOUDLB_DRAIN_REPS=100 $(BIN)/pytest tests/lab/test_bgp_frr.py -q -s \
		-p no:cacheprovider -k "never_re_announces or drain_right_after"

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
# scripts/lab.py keeps molecule's whole log in a file (its path printed), shows one
# line per play, and ends with tables: hosts, VIPs with their MAC, node and HTTP check,
# measured failover/drain/rolling-restart times.
lab: deps venv
	$(PY) scripts/lab.py

lab-down: venv
	molecule destroy -s default

bench: deps venv
	$(PY) benchmarks/core_bench.py
	$(PY) benchmarks/heartbeat_sim.py --sizes 10,30 --seconds 5 --loss 0.2 --confirmations 1,2  # full: docs/benchmarks.md
	$(PY) benchmarks/reload_memory.py --vips 2000 --reloads 4
	$(PY) benchmarks/arp_latency.py -n 100 --sizes 1,1000 --no-busy --rates 2000,10000 --rate-seconds 0.25
	$(PY) benchmarks/handover.py --cycles 5
	$(PY) benchmarks/handoff.py --rounds 1
	$(PY) benchmarks/take_race.py --moves 40
	$(PY) benchmarks/dataplane.py --seconds 5
	$(PY) benchmarks/bgp.py --runs 3
	$(PY) benchmarks/flow_peers.py --peers 300
	$(PY) benchmarks/membership_scale.py --sizes 3,5 --trials 3 --window 10
	$(PY) benchmarks/ansible_scale.py --sizes 10
	$(PY) benchmarks/scale.py --vips 200 --idle 5 --arp 100 --settle 3 --after-kill 4  # full: docs/benchmarks.md

# The long benchmarks at full size (docs/benchmarks.md "Membership at size", "Ansible at size"):
# 3 to 80 speakers x 2 profiles (about 50 min), site.yml with 10, 300, 1,000 services (about 40-60 min);
# they rewrite the JSON and PNG under docs/images/.
bench-long: deps venv
	$(PY) benchmarks/membership_scale.py --sizes 3,5,10,20,40,60,80 --trials 8 --window 30 \
		--json docs/images/membership_scale.json --png docs/images/membership_scale.png
	$(PY) benchmarks/ansible_scale.py --sizes 10,300,1000 \
		--json docs/images/ansible_scale.json --png docs/images/ansible_scale.png

# About 8 minutes: 20 kill -9 per profile, keepalived beside the speaker.
bench-failover: deps venv
	$(PY) benchmarks/failover.py --kills 20 --keepalived

# keepalived side by side with the speaker (docs/benchmarks.md): 5 faults x 4 systems x
# TRIALS at a random phase; about 45 minutes at 20 trials on an idle 2-core machine.
TRIALS ?= 20
bench-side-by-side: deps venv
	$(PY) benchmarks/side_by_side.py --trials $(TRIALS) --json docs/images/side_by_side.json \
		--png docs/images/side_by_side.png

# False failovers of the same four systems: MINUTES under 10 % loss each way and under a CPU hog
# beside the master, every system and condition at once in one window; then redraws its plot
# (docs/images/false_failovers.svg, which docs-check compares with the JSON).
MINUTES ?= 10
.PHONY: bench-false-failover
bench-false-failover: deps venv
	$(PY) benchmarks/side_by_side.py --false-failover --minutes $(MINUTES) \
		--json docs/images/false_failovers.json
	$(PY) scripts/pictures.py

build: venv
	$(BIN)/ansible-galaxy collection build --force --output-path dist .

clean:
	rm -rf dist build tests/output .mypy_cache .ruff_cache .pytest_cache

# Chaos on the lab `chaos` (docs/chaos.md): who answers for every VIP under partitions, loss,
# CPU starvation, freezes, restarts, reboots and drains. `chaos` runs every fault and rewrites
# the results in docs/chaos.md (about 8 minutes); `chaos-short` is the bounded run `test` uses,
# failing when a goal is broken. The lab's name is fixed, hence the lock.
chaos: deps venv
	flock /tmp/nocloudlb-chaos.lock $(PY) tests/chaos/chaos.py --full --docs

chaos-short: deps venv
	flock /tmp/nocloudlb-chaos.lock $(PY) tests/chaos/chaos.py --short

# The partition matrix (docs/chaos.md, "When nodes disagree"): the faults where nodes disagree, with real
# speakers in namespaces, for the fast and lan profiles; rewrites its block of docs/chaos.md,
# docs/images/partitions-timeline.png and partitions.json (about 5 minutes). `make test` runs the fast
# rows with their bounds asserted (tests/netns/test_partition_matrix.py, in the netns step).
chaos-partitions: deps venv
	flock /tmp/nocloudlb-netns.lock $(PY) benchmarks/partitions.py --docs
