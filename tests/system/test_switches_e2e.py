"""With switches: terra-controller (its os-ken app) and Open vSwitch in Mininet, agents in
Mininet hosts; a WAN link set down produces a PortStatus that reroutes a running coflow."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from switch_triangle import bound_triangle
from test_controller_e2e import assert_digests, flow, wait_until
from tls_helpers import ensure

from benchmarks.harness import free_port, stop_processes
from terra_controller.client import TerraClient
from terra_security.pki import Role, client_context


@pytest.mark.ovs
@pytest.mark.filterwarnings("ignore::DeprecationWarning:mininet")
def test_with_switches_link_down_port_status_reschedules_and_loses_nothing(ovs, tmp_path, pki):
    """Three OVS switches (userspace datapath) and three agents in Mininet hosts.

    The controller installs the tunnel rules through its os-ken app, the agents
    reach it over the management network, and a WAN link set down in Mininet
    produces a PortStatus that reroutes a running coflow; nothing is lost.
    """
    from mininet.log import setLogLevel

    from mininet_scenarios.wan_net import MGMT_ROOT_IP, build_wan, cleanup
    from topologies.binding import load_binding
    from topologies.loaders import load_json_topology

    setLogLevel("critical")
    path = bound_triangle(tmp_path)  # 20 Mbit/s HTB links: 2.5 MB/s
    topo = load_json_topology(path)
    binding = load_binding(topo)
    of_port = free_port()
    log = open(tmp_path / "controller.log", "w")  # noqa: SIM115
    ctl = subprocess.Popen(
        [sys.executable, "-m", "terra_controller.cli", "--topology", str(path), "--k", "2",
         "--of-port", str(of_port), "--api", "127.0.0.1:0", "--agents", "0.0.0.0:0",
         "--rest", "127.0.0.1:0", "--pki", str(pki),
         "--data-prefix", "10.0.0.0/16"],  # agents come over mgmt, their data is on 10.0
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    procs, wan, client = [ctl], None, None
    try:
        addrs = dict(part.split("=") for part in ctl.stdout.readline().split()[2:])
        rest = "https://" + addrs["rest"]
        rest_tls = client_context(pki, "operator1")
        rest_tls.check_hostname = False

        def get(p):
            with urllib.request.urlopen(rest + p, timeout=5, context=rest_tls) as reply:
                return json.loads(reply.read())

        wan = build_wan(topo, binding, of_port=of_port, mgmt=True)
        wait_until(lambda: get("/tunnels")["switches"].get("installed"), 30, "rules installed")
        agents_port = addrs["agents"].rsplit(":", 1)[1]
        ids = {}
        for dc in topo.dcs:
            host = binding.hosts(dc)[0]
            ids[dc] = ensure(pki, Role.AGENT, host.name)
            procs.append(
                wan.hosts[host.name].popen(
                    [
                        sys.executable,
                        "-m",
                        "terra_agent.cli",
                        "--controller",
                        f"{MGMT_ROOT_IP}:{agents_port}",
                        "--dc",
                        dc,
                        "--id",
                        host.name,
                        "--data-addr",
                        f"{host.ip}:19000",
                        "--spill-dir",
                        str(tmp_path),
                        "--pki",
                        str(pki),
                    ],
                    stdout=open(tmp_path / f"{host.name}.log", "w"),
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        wait_until(lambda: sum(a["connected"] for a in get("/status")["agents"]) == 3, 30, "agents")
        host, port = addrs["api"].split(":")
        client = TerraClient(host, int(port), pki=pki, name="job1", timeout=10)
        # 12 MB A->B over A-B and A-C-B at 2.5 MB/s each: about 2.4 s.
        cid = client.submit_coflow([flow("f", ids["A"], ids["B"], 12_000_000)])
        wait_until(lambda: client.check_status(cid)["bytes_delivered"] >= 2_000_000, 60, "data")
        wan.set_link("A", "B", up=False)  # PortStatus -> os-ken app -> controller round
        wait_until(lambda: get("/status")["reactions_total"] >= 1, 10, "reschedule")

        def a_b() -> dict:
            return next(x for x in get("/topology")["links"] if (x["a"], x["b"]) == ("A", "B"))

        assert a_b()["state"] == "down"
        # the rescheduled round's allocation reaches the REST view a moment after the
        # reaction is counted: it must put nothing on the down link
        wait_until(lambda: a_b()["allocated_bytes_per_s"] == 0, 10, "A-B allocation 0")
        status = client.wait(cid, timeout=120)
        assert_digests(status)
        switches = get("/tunnels")["switches"]
        assert switches["flow_mods"] > switches["flow_mods_at_install"]  # A-B tunnels removed
        assert {d: len(r) for d, r in switches["rules"].items()} == {
            str(d): n for d, n in switches["rules_per_switch"].items()
        }
    finally:
        if client is not None:
            client.close()
        stop_processes(procs)
        try:
            if wan is not None:
                wan.stop()
        except Exception:
            cleanup()  # `mn -c` removes every bridge on the machine: only when stop failed
            raise
        finally:
            log.close()
