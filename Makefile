# pstate: `make run` and `make test` do all the set-up on a fresh Debian/Ubuntu machine (as root).

SHELL := /bin/bash
PYTHON_SYS := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
PSTATE := $(VENV)/bin/pstate
KREL := $(shell uname -r)
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
APT_PACKAGES := python3-bpfcc python3-venv python3-pip python3-setuptools python3-wheel python3-dev gcc bpftool linux-perf tmux groff-base man-db jq \
	zsh fish bash-completion util-linux bpftrace bpfcc-tools sudo
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: setup run test test-truth soak test-tracepoint test-waking test-fast test-kernels bench artifacts install print-install-dirs clean

setup: $(VENV)/.installed
	@$(PSTATE) doctor

# apt packages that are missing; a kernel header tree only when the running
# kernel has none (pstate merges Debian's split -common/-<arch> trees itself).
$(VENV)/.apt-done:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ ! -e /lib/modules/$(KREL)/build ] && ! ls -d /usr/src/linux-headers-* >/dev/null 2>&1; then \
	    missing="$$missing linux-headers-$(ARCH)"; fi; \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@[ -d $(VENV) ] || $(PYTHON_SYS) -m venv --system-site-packages $(VENV)
	@touch $@

$(VENV)/.installed: $(VENV)/.apt-done $(VENV)/bin/promtool pyproject.toml setup.py $(wildcard cli/pstate/_*.c) bpf/pstate.h
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test,perfetto,zstd]'
	@touch $@

# promtool (the tests check snap's Prometheus text with it): the one on PATH,
# else the binary of Debian's prometheus package, extracted (the package
# itself would install and start a server)
$(VENV)/bin/promtool: $(VENV)/.apt-done
	@if command -v promtool >/dev/null 2>&1; then ln -sf "$$(command -v promtool)" $@; else \
	    tmp=$$(mktemp -d) && (cd $$tmp && apt-get download -qq prometheus >/dev/null 2>&1) && \
	    dpkg-deb -x $$tmp/prometheus_*.deb $$tmp/x && cp $$tmp/x/usr/bin/promtool $@; \
	    rm -rf $$tmp; [ -x $@ ] || echo "promtool: not installed (the Prometheus test will fail)"; fi

run: setup
	$(PSTATE) record --duration 5 | $(PSTATE) stats

# Two gates, chosen by markers (pyproject.toml says what each means).
# test-fast: the contract suite, every test not marked kernel, reliability,
# load or slow: in parallel (pytest-xdist, TEST_JOBS workers), then those of
# them marked serial one at a time, alone on the machine. test: test-fast,
# then the rest the same way. Every suite runs; the target fails if any did.
# Each ends with a line of its own, "::: SUITE: N s, exit C" (its wall time).
# (one worker more than CPUs: the BPF tests spend much of their time
# waiting for their workloads, and the CPUs stay busy: 167 s against 195 s
# of pytest wall time for test-fast on 2 CPUs)
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
FAST := not (kernel or reliability or load or slow)
PARALLEL := $(PY) -m pytest -ra -n $(TEST_JOBS) --dist loadgroup
SERIAL := $(PY) -m pytest -ra -p no:xdist
# suite NAME COMMAND...: run it, say how long it took; pytest's 5 (no test
# selected, e.g. PYTEST_ARGS naming files of one gate only) is a pass
SUITE = bash -c 't0=$$(date +%s%N); "$${@:2}"; rc=$$?; [ $$rc -eq 5 ] && rc=0; \
	echo "::: $$1: $$(( ($$(date +%s%N) - t0) / 1000000000 )) s, exit $$rc"; exit $$rc' suite

test-fast: setup
	@rc=0; \
	$(SUITE) "test-fast (parallel)" $(PARALLEL) -m "($(FAST)) and not serial" $(PYTEST_ARGS) || rc=1; \
	$(SUITE) "test-fast (serial)" $(SERIAL) -m "($(FAST)) and serial" $(PYTEST_ARGS) || rc=1; \
	exit $$rc

test: setup
	@rc=0; \
	$(MAKE) --no-print-directory test-fast || rc=1; \
	$(MAKE) --no-print-directory test-truth || rc=1; \
	exit $$rc

# test-truth: the kernel-truth, reliability, load and slow suites (the part
# of `make test` after test-fast)
test-truth: setup
	@rc=0; \
	$(SUITE) "kernel, reliability, load, slow (parallel)" $(PARALLEL) -m "not ($(FAST)) and not serial" $(PYTEST_ARGS) || rc=1; \
	$(SUITE) "kernel, reliability, load, slow (serial)" $(SERIAL) -m "not ($(FAST)) and serial" $(PYTEST_ARGS) || rc=1; \
	exit $$rc

# soak: a gate RUNS times in a row under a busy loop on each CPU (tests/soak.py)
RUNS ?= 10
TARGET ?= test-fast
soak: setup
	$(PY) tests/soak.py --runs $(RUNS) --target $(TARGET) $(SOAK_ARGS)

# record's and snap's BPF tests once more on the classic tracepoint path
# (`make test` takes the tp_btf path where the kernel has BTF; the tests that
# compare the two paths run in both): about two minutes more.
test-tracepoint: setup
	PSTATE_PROBES=tracepoint $(PY) -m pytest -ra -m bpf tests/smoke/test_record_bpf.py tests/truth/test_kernel_truth.py \
		tests/smoke/test_snap_bpf.py tests/contract/test_progcache.py tests/truth/test_flight_bpf.py tests/smoke/test_stacks_bpf.py \
		tests/truth/test_collector_bpf.py tests/truth/test_fold_bpf.py tests/smoke/test_cgroup_bpf.py $(PYTEST_ARGS)

# record's BPF tests once more with its wake-ups at sched_waking, the path of
# kernels without the wake list's tracepoint (before Linux 6.5, or no BTF),
# which this kernel would not otherwise take
test-waking: setup
	PSTATE_WAKE_LIST=off $(PY) -m pytest -ra -m bpf tests/smoke/test_record_bpf.py tests/truth/test_kernel_truth.py \
		tests/smoke/test_stacks_bpf.py $(PYTEST_ARGS)

# The kernel matrix (tests/kernels/matrix.py, as root): the checks of record,
# snap, the collector and doctor here and on Debian's 5.10, 6.1, 6.1-rt and
# 6.12 kernels, each fetched with a private apt configuration and booted under
# qemu (virtme-ng), one guest at a time; one table, non-zero on any failure.
# KERNELS="deb61 deb510" (host: this kernel) and CHECKS="record snap" choose.
test-kernels: $(VENV)/.installed
	$(PY) tests/kernels/matrix.py --kernels "$(KERNELS)" --checks "$(CHECKS)"

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info

# Regenerate man/ and completions/ from the click commands and schema.py, the
# figures in README.md and docs/performance.md from bench/results/latest.json,
# and docs/kernels.md from tests/kernels/.
artifacts:
	$(PY) -m pstate.docs.docgen
	$(PY) tests/kernels/kdoc.py

# A private venv (system site packages: bcc comes from apt) under
# $(PREFIX)/lib/pstate, pstate linked into $(PREFIX)/bin, man pages and
# completions where man, bash-completion, zsh and fish look for them.
# The wheel is built with the distribution's setuptools, offline; the venv
# gets no pip or setuptools of its own (the system pip installs into it);
# pstate is installed by name from a local directory, so no record of the
# build directory is left in it. With DESTDIR (staging for a package) the
# venv's paths are rewritten to the final $(PREFIX) and the byte code is
# compiled for the final paths.
VENV_DIR = $(DESTDIR)$(PREFIX)/lib/pstate
WHEELS := build/install-wheels
# fish reads vendor completions from its own data directory (and from
# $$XDG_DATA_DIRS only when that is set): for /usr and /usr/local, where
# fish's pkg-config file names it; under any other prefix, the XDG place.
FISH_PKG_DIR := $(shell pkg-config --variable completionsdir fish 2>/dev/null)
FISH_COMPLETIONSDIR ?= $(if $(and $(FISH_PKG_DIR),$(filter /usr /usr/local,$(PREFIX))),$(FISH_PKG_DIR),$(PREFIX)/share/fish/vendor_completions.d)

# systemd units (installed, not enabled: systemctl enable --now
# pstate-collector.service pstate-snap.timer) and a crontab example
SYSTEMD_UNITDIR ?= $(PREFIX)/lib/systemd/system

install:
	@test -f man/pstate.1 -a -f completions/pstate.bash || { echo "man/ or completions/ missing: run make artifacts" >&2; exit 1; }
	rm -rf $(WHEELS)
	$(PYTHON_SYS) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w $(WHEELS) .
	$(PYTHON_SYS) -m pip download -q --disable-pip-version-check -d $(WHEELS) $(WHEELS)/pstate-*.whl
	$(PYTHON_SYS) -m venv --without-pip --system-site-packages $(VENV_DIR)
	$(PYTHON_SYS) -m pip --python $(VENV_DIR)/bin/python install -q --disable-pip-version-check \
	    --no-warn-script-location --no-compile --no-index --find-links $(WHEELS) --upgrade pstate
	$(PYTHON_SYS) -m compileall -q $(if $(DESTDIR),-s $(abspath $(DESTDIR)) -p /) $(VENV_DIR)/lib
	@if [ -n "$(DESTDIR)" ]; then \
	    grep -rlIF "$(abspath $(DESTDIR)$(PREFIX))/lib/pstate" $(VENV_DIR)/bin $(VENV_DIR)/pyvenv.cfg \
	    | xargs -r sed -i "s|$(abspath $(DESTDIR)$(PREFIX))/lib/pstate|$(PREFIX)/lib/pstate|g"; fi
	install -d $(DESTDIR)$(PREFIX)/bin
	ln -sfn ../lib/pstate/bin/pstate $(DESTDIR)$(PREFIX)/bin/pstate
	install -Dm644 -t $(DESTDIR)$(PREFIX)/share/man/man1 man/*.1
	install -Dm644 -t $(DESTDIR)$(PREFIX)/share/man/man5 man/*.5
	install -Dm644 completions/pstate.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/pstate
	install -Dm644 completions/_pstate $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_pstate
	install -Dm644 completions/pstate.fish $(DESTDIR)$(FISH_COMPLETIONSDIR)/pstate.fish
	install -Dm644 LICENSE $(DESTDIR)$(PREFIX)/share/doc/pstate/LICENSE
	install -d $(DESTDIR)$(SYSTEMD_UNITDIR) $(DESTDIR)$(PREFIX)/share/doc/pstate
	for f in pstate-collector.service pstate-snap.service pstate-snap.timer; do \
	    sed 's|@BINDIR@|$(PREFIX)/bin|g' cli/share/systemd/$$f > $(DESTDIR)$(SYSTEMD_UNITDIR)/$$f && \
	    chmod 644 $(DESTDIR)$(SYSTEMD_UNITDIR)/$$f || exit 1; done
	sed 's|@BINDIR@|$(PREFIX)/bin|g' cli/share/systemd/pstate-snap.cron > $(DESTDIR)$(PREFIX)/share/doc/pstate/pstate-snap.cron
	chmod 644 $(DESTDIR)$(PREFIX)/share/doc/pstate/pstate-snap.cron
	install -Dm644 cli/share/grafana/pstate-dashboard.json $(DESTDIR)$(PREFIX)/share/pstate/grafana/pstate-dashboard.json

# Where `make install` puts each kind of file (for packagers and tests).
print-install-dirs:
	@echo "fish_completions $(FISH_COMPLETIONSDIR)"
	@echo "systemd_units $(SYSTEMD_UNITDIR)"
