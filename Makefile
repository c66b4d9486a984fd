# pstate: `make run` and `make test` do all the set-up on a fresh Debian/Ubuntu machine (as root).

SHELL := /bin/bash
PYTHON_SYS := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
PSTATE := $(VENV)/bin/pstate
KREL := $(shell uname -r)
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
APT_PACKAGES := python3-bpfcc python3-venv python3-pip python3-dev gcc bpftool linux-perf tmux groff-base man-db jq \
	zsh fish bash-completion util-linux bpftrace bpfcc-tools
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: setup run test test-fast bench artifacts install clean

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

$(VENV)/.installed: $(VENV)/.apt-done pyproject.toml setup.py $(wildcard cli/pstate/_*.c) bpf/pstate.h
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

run: setup
	$(PSTATE) record --duration 5 | $(PSTATE) stats

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info

# Regenerate man/ and completions/ from the click commands and schema.py.
artifacts:
	$(PY) -m pstate.docgen

# A private venv (system site packages: bcc comes from apt) under
# $(PREFIX)/lib/pstate, pstate linked into $(PREFIX)/bin, man pages and
# completions where man, bash-completion, zsh and fish look for them.
# With DESTDIR (staging for a package) the venv's paths are rewritten to the
# final $(PREFIX).
install:
	@test -f man/pstate.1 -a -f completions/pstate.bash || { echo "man/ or completions/ missing: run make artifacts" >&2; exit 1; }
	$(PYTHON_SYS) -m venv --system-site-packages $(DESTDIR)$(PREFIX)/lib/pstate
	$(DESTDIR)$(PREFIX)/lib/pstate/bin/python -m pip install -q --disable-pip-version-check --no-warn-script-location --upgrade .
	@if [ -n "$(DESTDIR)" ]; then \
	    grep -rlIF "$(abspath $(DESTDIR)$(PREFIX))/lib/pstate" $(DESTDIR)$(PREFIX)/lib/pstate/bin $(DESTDIR)$(PREFIX)/lib/pstate/pyvenv.cfg \
	    | xargs -r sed -i "s|$(abspath $(DESTDIR)$(PREFIX))/lib/pstate|$(PREFIX)/lib/pstate|g"; fi
	install -d $(DESTDIR)$(PREFIX)/bin
	ln -sfn ../lib/pstate/bin/pstate $(DESTDIR)$(PREFIX)/bin/pstate
	install -Dm644 -t $(DESTDIR)$(PREFIX)/share/man/man1 man/*.1
	install -Dm644 -t $(DESTDIR)$(PREFIX)/share/man/man5 man/*.5
	install -Dm644 completions/pstate.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/pstate
	install -Dm644 completions/_pstate $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_pstate
	install -Dm644 completions/pstate.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/pstate.fish
