#!/usr/bin/env bash
# Install everything on a fresh Debian 12 machine (as root) and start Open vSwitch.
# Idempotent: safe to run again on a machine that already has it all.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# System packages: Open vSwitch (userspace datapath; the kernel has no OVS module), Mininet's
# mnexec and its tools (Debian's mininet pulls iperf, net-tools, socat, cgroup-tools), ping,
# ethtool (offloads off), iproute2 (ip, tc/HTB), psmisc and procps (killall/pkill for `mn -c`),
# prometheus (its promtool checks deploy/prometheus; the testbed's --observe runs it),
# chromium and chromium-driver (headless browser for tests/integration/test_web_page.py and
# tests/system/test_console_testbed.py, driven by Selenium through the system chromedriver:
# nothing is downloaded at run time), etcd-server (the shared
# state of several controllers, terra-controller --etcd; tests start their own etcd processes).
APT_PACKAGES=(openvswitch-switch mininet iputils-ping ethtool iproute2 psmisc procps prometheus
              chromium chromium-driver etcd-server)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# uv (Python env manager) from PyPI when the machine has none.
export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
        apt-get update -q
        apt-get install -y -q --no-install-recommends python3-pip
    fi
    python3 -m pip install -q uv || python3 -m pip install -q --break-system-packages uv
    hash -r
    command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
fi
uv --version

# Python environment (.venv) from pyproject.toml / uv.lock: every extra (testbed, plots, sim,
# bench) and the dev group, compiled to bytecode here, and the checkout's own modules too.
# Without it, where PYTHONDONTWRITEBYTECODE is set (it is on the machine docs/results.md's
# figures come from) every process compiles every module it imports from source, every
# time: a controller took 2.7 CPU s to start instead of 0.9, an agent 0.4 instead of 0.14.
uv sync --all-extras --compile-bytecode
uv run python -m compileall -q -j 0 -x '/\.(venv|git)/' . >/dev/null

# numba's compiled kernels into __pycache__ once, here, by one process: every later process
# (controllers, terra-sim, the tests' parallel workers) loads them (about 1.5 s) instead of
# compiling them (11 CPU s), and no two processes compile the same kernel at once.
uv run terra-sim --topology swan --workload fb --link-gbps 1 --scheduler all --limit 20 \
    --jobs 1 >/dev/null

# Open vSwitch: ovsdb-server + ovs-vswitchd (no kernel module is loaded or needed).
OVS_CTL=/usr/share/openvswitch/scripts/ovs-ctl
if ! "$OVS_CTL" status >/dev/null 2>&1; then
    "$OVS_CTL" start --system-id=random
fi
ovs-vsctl --timeout=10 show >/dev/null
# Leftovers of an interrupted Mininet run (bridges, veths, namespaces' processes).
mn -c >/dev/null 2>&1 || true
