#!/usr/bin/env bash
# Set up, then run the whole test suite (what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# System packages the tests drive, installed with apt-get when missing (as root, or with sudo
# that needs no password): OpenSSH's sshd for the remote-host tests (a real server on
# 127.0.0.1), Debian's Chromium for the browser tests (driven by Playwright; no browser is
# downloaded). A browser test without its browser fails, saying what to install
# (EYAS_REQUIRE_BROWSER=0 skips it instead); the remote-host tests without sshd are skipped.
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server openssh-client)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n); else sudo=(false); fi
  fi
  if [ "${sudo[*]}" != false ]; then
    echo "installing ${missing[*]} (apt-get)" >&2
    ("${sudo[@]}" apt-get update -qq \
      && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null \
      || echo "could not install ${missing[*]}: the tests that need them will say so" >&2
  fi
fi
export PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export EYAS_REQUIRE_BROWSER="${EYAS_REQUIRE_BROWSER:-1}"
# One OpenMP thread per process: several test processes share 2 cores, and OpenMP's threads
# spin while they wait for a core (measured: the same 3 files on 3 workers took 14 % less wall
# time and 14 % less CPU).
# A test that wants more threads sets them itself.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Several pytest-xdist workers, one test file each at a time (a file's module fixtures are set
# up once): most tests wait on servers, ssh and subprocesses, so 2 cores keep 4 busy. Files go
# longest first (tests/support/suite_order.py); --no-loadscope-reorder keeps that order, which
# pytest-xdist would otherwise replace with "most tests first" (the drills last).
# EYAS_TEST_WORKERS=0 runs everything in this one process.
workers="${EYAS_TEST_WORKERS:-4}"
if [ "$workers" = 0 ]; then exec .venv/bin/python -m pytest "$@"; fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
