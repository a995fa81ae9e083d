"""REST views and /metrics over HTTPS (operator certificate), against an in-process controller
with TerraPolicy."""

import base64
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tls_helpers import security

from terra_controller.agent_channel import AgentChannel
from terra_controller.controller import Controller
from terra_controller.rest import RestApp, start_rest_server
from terra_controller.transport import ServerSecurity
from terra_controller.tunnel_table import TunnelTable
from terra_core.terra_policy import TerraPolicy
from terra_security.pki import Identity, Role, client_context, server_context
from terra_security.tokens import issue_token, new_key
from topologies import Topology

CAP = 1e8  # bytes/s per directed link


def daemon_spawn(func, *args):
    thread = threading.Thread(target=func, args=args, daemon=True)
    thread.start()
    return thread


CONTEXT: dict[str, ssl.SSLContext] = {}  # base URL -> the client TLS context to use


def context(pki, name=None):
    """A client TLS context with `name`'s certificate (None: no certificate)."""
    if name is None:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    else:
        ctx = client_context(pki, name)
    ctx.check_hostname = False  # the tests dial 127.0.0.1; the CA is still verified
    return ctx


def serve(pki, public=False, optional=False):
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = CAP
    topology = Topology("tri", ["A", "B", "C"], links)
    # the paper's fixed reserve: even a lone coflow's round then solves an LP (step 6's MCF
    # on the held-back share), which the LP metrics tests count; the aged guard solves none
    controller = Controller(topology, TerraPolicy(topology, k=2, guard="fixed"))
    for agent, dc in [("a1", "A"), ("b1", "B"), ("c1", "C")]:
        controller.registry.register_agent(agent, dc, "127.0.0.1:30000")
    channel = AgentChannel(controller, TunnelTable(topology, 2))
    sec = (
        ServerSecurity(server_context(pki, require_client_cert=False))
        if public or optional
        else security(pki)
    )
    server, _, (host, port) = start_rest_server(
        RestApp(controller, channel),
        "127.0.0.1",
        0,
        sec,
        public,
        daemon_spawn,
        owner=controller.owner,
    )
    base = f"https://{host}:{port}"
    CONTEXT[base] = context(pki, "operator1")
    return controller, base, server


@pytest.fixture
def rest(pki):
    controller, base, server = serve(pki)
    yield controller, base
    server.shutdown()


def get(base, path, ctx=None):
    with urllib.request.urlopen(base + path, timeout=5, context=ctx or CONTEXT[base]) as reply:
        return reply.status, reply.headers["Content-Type"], reply.read()


def get_json(base, path):
    return json.loads(get(base, path)[2])


def test_status_and_coflows(rest):
    controller, base = rest
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**9}])
    controller.run_round()
    status = get_json(base, "/status")
    assert status["topology"] == "tri" and status["rounds"] == 1
    assert {a["id"] for a in status["agents"]} == {"a1", "b1", "c1"}
    assert not any(a["connected"] for a in status["agents"])  # no agent connected here
    assert get_json(base, "/coflows") == [
        {k: v for k, v in controller.status(cid).items() if k != "flows"}
    ]


def test_topology_and_coflow_allocations_agree(rest):
    controller, base = rest
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**9}])
    controller.run_round()
    # One coflow A->B on K=2 paths (A-B and A-C-B): it gets both paths; with α = 0.1
    # reserved and then handed back by work conservation the total stays <= 2 * CAP.
    coflow = get_json(base, f"/coflows/{cid}")
    (group,) = coflow["flowgroups"]
    assert (group["src_dc"], group["dst_dc"]) == ("A", "B")
    rates = {tuple(p["path"]): p["rate_bytes_per_s"] for p in group["paths"]}
    assert set(rates) <= {("A", "B"), ("A", "C", "B")} and sum(rates.values()) > 0
    assert sum(f["rate_bytes_per_s"] for f in coflow["flows"]) == pytest.approx(sum(rates.values()))
    assert group["bytes_remaining"] == 10**9
    assert [f["bytes_delivered"] for f in coflow["flows"]] == [0]
    topology = get_json(base, "/topology")
    assert topology["links"] == get_json(base, "/links")["links"]
    links = {(x["a"], x["b"]): x for x in topology["links"]}
    assert set(links[("A", "B")]) >= {
        "a", "b", "capacity_bytes_per_s", "capacity_gbps", "state", "allocated_bytes_per_s"
    }  # fmt: skip
    assert "src" not in links[("A", "B")] and "capacity" not in links[("A", "B")]
    assert len(links) == 6 and all(x["capacity_bytes_per_s"] == CAP for x in links.values())
    assert all(x["capacity_gbps"] == pytest.approx(CAP * 8 / 1e9) for x in links.values())
    # Allocated rate per link = the sum of the rates of the paths crossing it.
    alloc = {link: x["allocated_bytes_per_s"] for link, x in links.items()}
    assert alloc[("A", "B")] == pytest.approx(rates.get(("A", "B"), 0.0))
    assert alloc[("A", "C")] == pytest.approx(rates.get(("A", "C", "B"), 0.0))
    assert alloc[("C", "B")] == pytest.approx(rates.get(("A", "C", "B"), 0.0))
    assert alloc[("B", "A")] == 0
    assert all(x <= CAP * (1 + 1e-9) for x in alloc.values())


def test_link_state_shows_in_topology_and_tunnels(rest):
    controller, base = rest
    controller.set_link_state("A", "B", False)
    links = {(x["a"], x["b"]): x["state"] for x in get_json(base, "/links")["links"]}
    assert links[("A", "B")] == links[("B", "A")] == "down" and links[("A", "C")] == "up"
    tunnels = get_json(base, "/tunnels")
    assert tunnels["logical"] is True
    # 3 DCs -> 6 ordered pairs, each with K = 2 paths in a triangle: 12 tunnels.
    assert len(tunnels["tunnels"]) == 12
    down = [t["path"] for t in tunnels["tunnels"] if not t["up"]]
    assert sorted(down) == [["A", "B"], ["A", "B", "C"], ["B", "A"], ["B", "A", "C"],
                            ["C", "A", "B"], ["C", "B", "A"]]  # fmt: skip


def test_metrics_in_prometheus_format(rest):
    controller, base = rest
    controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 1000}])
    controller.run_round()
    controller.complete(0, "f", "digest")
    controller.run_round()
    status, ctype, body = get(base, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    samples = {
        s.name: s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
        if not s.labels
    }
    assert samples["terra_round_duration_seconds_count"] == 2
    assert samples["terra_round_duration_seconds_sum"] > 0
    assert samples["terra_bytes_delivered_total"] == 1000
    assert samples["terra_coflows_admitted_total"] == 1
    assert samples["terra_lps_solved_total"] >= 1
    assert samples["process_resident_memory_bytes"] > 0  # process collector


def labelled(base) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} of a /metrics scrape."""
    body = get(base, "/metrics")[2].decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }


def test_metrics_follow_links_coflow_states_and_admissions(rest):
    """Labelled link gauges agree with /topology; coflows are counted by state while active
    and by final state once finished, even after finished coflows leave memory; LP solves
    and rounds land in histograms (seconds)."""
    controller, base = rest
    controller.keep_finished = 1  # keep one finished coflow in memory
    controller.set_link_state("A", "C", False)
    run = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**9}])
    gone = controller.submit([{"id": "f", "src": "a1", "dst": "c1", "bytes": 10**6}])
    controller.run_round()
    m = labelled(base)
    links = {ends(x): x for x in get_json(base, "/topology")["links"]}
    for (a, b), link in links.items():
        key = (("a", a), ("b", b))
        capacity = link.get("capacity_bytes_per_s", link.get("capacity"))
        allocated = link.get("allocated_bytes_per_s", link.get("allocated"))
        assert m[("terra_link_capacity_bytes_per_second", key)] == capacity
        assert m[("terra_link_allocated_bytes_per_second", key)] == pytest.approx(allocated)
        assert m[("terra_link_up", key)] == (1.0 if link["state"] == "up" else 0.0)
    assert m[("terra_link_up", (("a", "A"), ("b", "C")))] == 0.0
    assert m[("terra_link_allocated_bytes_per_second", (("a", "A"), ("b", "B")))] > 0
    active = {s: m[("terra_coflows_active", (("state", s),))] for s in ("queued", "running",
                                                                         "preempted")}  # fmt: skip
    assert sum(active.values()) == 2 and active["running"] >= 1
    assert m[("terra_lp_solve_duration_seconds_count", ())] >= 1
    assert get_json(base, "/status")["coflows"] == states_walked(base)
    assert m[("terra_round_duration_seconds_count", ())] == 1
    # The 1 GB coflow finishes, the other is cancelled, a third fails: three final states.
    controller.progress(run, "f", 5 * 10**8)
    controller.complete(run, "f", "d")
    controller.cancel(gone)
    third = controller.submit([{"id": "f", "src": "b1", "dst": "c1", "bytes": 10**6}])
    controller.fail_flow(third, "f", "disk full")
    m = labelled(base)
    finished = {s: m[("terra_coflows_finished_total", (("state", s),))]
                for s in ("done", "failed", "cancelled")}  # fmt: skip
    assert finished == {"done": 1, "failed": 1, "cancelled": 1}
    dropped = {s: m[("terra_coflows_dropped_total", (("state", s),))]
               for s in ("done", "cancelled")}  # fmt: skip
    assert dropped == {"done": 1, "cancelled": 1}  # only the failed one is still in memory
    assert m[("terra_coflows_in_memory", ())] == 1
    assert sum(m[("terra_coflows_active", (("state", s),))] for s in active) == 0
    assert m[("terra_bytes_delivered_total", ())] == 10**9
    assert m[("terra_coflows_admitted_total", ())] == 3
    assert m[("terra_agents_registered", ())] == 3
    assert m[("terra_agent_connections", ())] == 0
    # /status counts states without walking the coflows; a walk agrees.
    assert get_json(base, "/status")["coflows"] == states_walked(base) == {"failed": 1}


def ends(link: dict) -> tuple[str, str]:
    """A REST link's (a, b), whether named a/b or src/dst."""
    return link.get("a", link.get("src")), link.get("b", link.get("dst"))


def states_walked(base) -> dict[str, int]:
    """{state: n} counted over /coflows."""
    out: dict[str, int] = {}
    for c in get_json(base, "/coflows"):
        out[c["state"]] = out.get(c["state"], 0) + 1
    return out


def test_metrics_registries_are_per_controller(pki):
    """Two controllers in one process: each /metrics counts only its own events."""
    first, base1, server1 = serve(pki)
    second, base2, server2 = serve(pki)
    try:
        first.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**6}])
        assert labelled(base1)[("terra_coflows_admitted_total", ())] == 1
        assert labelled(base2)[("terra_coflows_admitted_total", ())] == 0
    finally:
        for server in (server1, server2):
            server.shutdown()


@pytest.mark.parametrize(
    "path", ["/nothing", "/coflows/7", "/coflows/x", "/coflows/-1", "/coflows/" + "9" * 5000]
)
def test_unknown_resources_are_404(rest, path):
    _, base = rest
    with pytest.raises(urllib.error.HTTPError) as info:
        get(base, path)
    assert info.value.code == 404
    assert "error" in json.loads(info.value.read())


def test_paths_with_control_characters_are_404(rest):
    """A path is matched whole: "/status" or a coflow's path with a newline after it
    ("%0A") names nothing."""
    controller, base = rest
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 1000}])
    assert get_json(base, f"/coflows/{cid}")["id"] == cid
    for path in (f"/coflows/{cid}%0A", "/status%0A", "/status%0D%0A", "/links%00"):
        with pytest.raises(urllib.error.HTTPError) as info:
            get(base, path)
        assert info.value.code == 404, path


def test_read_only(rest):
    _, base = rest
    request = urllib.request.Request(base + "/coflows", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=5, context=CONTEXT[base])
    assert info.value.code == 405
    assert info.value.headers["Allow"] == "GET"
    assert get_json(base, "/coflows") == []


def test_flows_cut_off_by_failures_wait_and_the_rest_is_scheduled(rest):
    controller, base = rest
    cid = controller.submit(
        [
            {"id": "ab", "src": "a1", "dst": "b1", "bytes": 10**9},
            {"id": "ac", "src": "a1", "dst": "c1", "bytes": 10**9},
        ]
    )
    # Cut C off: both of its links down. A->C has no path; A->B keeps the direct link.
    controller.set_link_state("A", "C", False)
    controller.set_link_state("B", "C", False)
    controller.run_round()  # must not fail because one FlowGroup cannot be routed
    rates = {f["id"]: f["rate_bytes_per_s"] for f in get_json(base, f"/coflows/{cid}")["flows"]}
    assert rates["ac"] == 0 and rates["ab"] > 0
    controller.set_link_state("A", "C", True)
    controller.run_round()
    rates = {f["id"]: f["rate_bytes_per_s"] for f in get_json(base, f"/coflows/{cid}")["flows"]}
    assert rates["ac"] > 0 and rates["ab"] > 0


@pytest.mark.parametrize("who", [None, "job1", "a1"])
def test_rest_needs_an_operator_certificate(rest, pki, who):
    """No certificate, or a job's or an agent's: the connection is refused before any HTTP."""
    _, base = rest
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(base, "/status", context(pki, who))


def test_without_an_operator_certificate_only_healthz_is_served(pki):
    """The controller's REST server (client certificates optional, not --rest-public):
    /healthz for anyone, 401 for the rest unless the peer is an operator (or has a token)."""
    _, base, server = serve(pki, optional=True)
    try:
        for who in (None, "job1", "a1"):
            health = json.loads(get(base, "/healthz", context(pki, who))[2])
            assert health == {"role": "single", "leader": None, "state_version": 0}
            with pytest.raises(urllib.error.HTTPError) as err:
                get(base, "/status", context(pki, who))
            assert err.value.code == 401
            assert err.value.headers["WWW-Authenticate"].startswith("Bearer")
            assert "operator certificate" in json.loads(err.value.read())["error"]
        assert get_json(base, "/status")["topology"] == "tri"  # operator1
        assert get_json(base, "/healthz")["role"] == "single"
    finally:
        server.shutdown()


def test_rest_public_serves_clients_without_a_certificate(pki):
    controller, base, server = serve(pki, public=True)
    try:
        assert get_json(base, "/status")["topology"] == "tri"  # operator certificate
        status = json.loads(get(base, "/status", context(pki, None))[2])  # none at all
        assert status["topology"] == "tri"
    finally:
        server.shutdown()


def test_recent_coflows_query_and_link_bytes(rest):
    """/coflows?finished=N lists every active coflow and the N that finished last;
    acknowledged bytes are counted on the links of the flow's paths in proportion to the
    path rates (/links bytes_delivered, terra_link_delivered_bytes_total)."""
    controller, base = rest
    done = []
    for _ in range(3):
        cid = controller.submit([{"id": "f", "src": "b1", "dst": "c1", "bytes": 1000}])
        controller.complete(cid, "f", "d")
        done.append(cid)
    active = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**9}])
    controller.run_round()
    assert [c["id"] for c in get_json(base, "/coflows?finished=2")] == [active, *done[:0:-1]]
    assert [c["id"] for c in get_json(base, "/coflows?finished=0")] == [active]
    assert len(get_json(base, "/coflows")) == 4
    for bad in ("x", "-1", "9" * 12):
        with pytest.raises(urllib.error.HTTPError) as info:
            get(base, f"/coflows?finished={bad}")
        assert info.value.code == 400
    rates = {tuple(p["path"]): p.get("rate_bytes_per_s", p.get("rate"))
             for p in get_json(base, f"/coflows/{active}")["flowgroups"][0]["paths"]}  # fmt: skip
    total = sum(rates.values())
    controller.progress(active, "f", 10**6)
    links = {ends(x): x["bytes_delivered"] for x in get_json(base, "/links")["links"]}
    expect = {}
    for path, rate in rates.items():
        for link in zip(path[:-1], path[1:], strict=False):
            expect[link] = expect.get(link, 0.0) + 10**6 * rate / total
    assert expect and all(links[k] == pytest.approx(v) for k, v in expect.items())
    assert sum(links.values()) == pytest.approx(sum(expect.values()))
    m = labelled(base)
    for (a, b), v in expect.items():
        assert m[("terra_link_delivered_bytes_total", (("a", a), ("b", b)))] == pytest.approx(v)
    assert get_json(base, "/topology")["positions"] == {}  # the test topology places no DC


def test_web_page_files_are_served_with_a_content_security_policy(rest):
    _, base = rest
    status, ctype, body = get(base, "/")
    assert status == 200 and ctype.startswith("text/html") and b"/static/app.js" in body
    with urllib.request.urlopen(base + "/static/app.js", timeout=5, context=CONTEXT[base]) as r:
        assert r.headers["Content-Type"].startswith("text/javascript")
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
        assert b"/coflows?finished=" in r.read()
    with pytest.raises(urllib.error.HTTPError) as info:
        get(base, "/static/../rest.py")
    assert info.value.code == 404


def test_positions_keep_only_two_finite_numbers_per_known_dc():
    from terra_controller.rest import positions

    given = {"A": [1, 2.5], "B": ["x", 1], "C": [float("nan"), 0], "D": [1, 2], "E": [True, 1]}
    assert positions(given, ["A", "B", "C", "E"]) == {"A": [1.0, 2.5]}
    assert positions("not a map", ["A"]) == {}
    from topologies import load_topology

    swan = load_topology("swan")
    assert set(positions(swan.attrs["positions"], swan.dcs)) == set(swan.dcs)


def test_metrics_export_every_controller_series_the_rules_read(rest):
    """deploy/prometheus/terra-rules.yml and the testbed's observer (mininet_scenarios/
    observe.py) read these series; all but the port counters (switches only) are here."""
    from mininet_scenarios.observe import CONTROLLER_SERIES

    controller, base = rest
    controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**6}])
    controller.run_round()
    names = {name for name, _ in labelled(base)}
    wanted = set(CONTROLLER_SERIES) - {"terra_link_measured_bytes_per_second"}
    assert wanted <= names, wanted - names


def test_a_failing_view_answers_500_and_the_server_keeps_serving(pki):
    """A view that raises: 500 with a JSON error; the next requests are served, trailing
    slashes included."""
    controller, base, server = serve(pki)
    try:
        controller.snapshot = None  # every view that reads a snapshot now fails
        with pytest.raises(urllib.error.HTTPError) as info:
            get(base, "/links")
        assert info.value.code == 500
        assert json.loads(info.value.read()) == {"error": "internal error (logged)"}
        del controller.snapshot  # the class's method again
        assert get_json(base, "/coflows/") == [] and get(base, "/metrics/")[0] == 200
    finally:
        server.shutdown()


def bearer(base, path, token, ctx):
    """GET `path` with "Authorization: Bearer token" over `ctx`; (status, JSON body)."""
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_an_operator_token_opens_rest_without_a_certificate(pki):
    """A browser without a client certificate: the page's files and /healthz are open, the
    JSON needs a token of the controller's key, unexpired, of an operator."""
    controller, base, server = serve(pki, optional=True)
    bare = context(pki, None)
    try:
        for path in ("/", "/static/app.js", "/static/style.css"):
            assert get(base, path, bare)[0] == 200
        key = controller.token_key
        token, expires = issue_token(key, Identity("operator1", Role.OPERATOR), ttl_s=60)
        assert expires > time.time() + 50
        for path in ("/status", "/events", "/agents", "/coflows?finished=5"):
            assert bearer(base, path, token, bare)[0] == 200
        assert bearer(base, "/status", token, bare)[1]["topology"] == "tri"
        # Refused: another key (forged), an altered payload, expired, garbage, no "Bearer".
        forged, _ = issue_token(new_key(), Identity("operator1", Role.OPERATOR))
        job, _ = issue_token(key, Identity("job1", Role.JOB))
        head, body, mac = job.split(".")
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        claims["r"] = "operator"
        raised = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        expired, _ = issue_token(key, Identity("operator1", Role.OPERATOR), 60,
                                 now=time.time() - 120)  # fmt: skip
        for bad, why in ((forged, "signature"), (f"{head}.{raised}.{mac}", "signature"),
                         (expired, "expired"), ("terra1.x.y", "not a token"),
                         (token + "x", "signature")):  # fmt: skip
            code, reply = bearer(base, "/status", bad, bare)
            assert code == 401 and why in reply["error"], (bad, reply)
        # A job's token is a job's identity: the operator REST refuses it as it would the
        # job's certificate.
        code, reply = bearer(base, "/status", job, bare)
        assert code == 403 and "job" in reply["error"]
        agent, _ = issue_token(key, Identity("a1", Role.AGENT))
        assert bearer(base, "/coflows", agent, bare)[0] == 403
        # A token sent as something else than Bearer is not read.
        request = urllib.request.Request(base + "/status", headers={"Authorization": token})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=5, context=bare)
        assert err.value.code == 401
    finally:
        server.shutdown()


def raw_exchange(port, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send `data` on a plain connection to 127.0.0.1:port and read until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@pytest.fixture
def plain_rest():
    """A REST server on the controller's loop without TLS (--insecure --rest-public)."""
    links = {("A", "B"): CAP, ("B", "A"): CAP}
    topology = Topology("pair", ["A", "B"], links)
    controller = Controller(topology, TerraPolicy(topology, k=1))
    server, _, (_, port) = start_rest_server(
        RestApp(controller), "127.0.0.1", 0, None, True, daemon_spawn, listeners={},
        owner=controller.owner,
    )  # fmt: skip
    yield controller, port
    server.shutdown()
    controller.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"garbage\r\n\r\n", b"400"),  # no request line
        (b"GET /status HTTP/1.1\r\n\r\n", b"400"),  # HTTP/1.1 without Host
        (b"GET /status HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"400"),
        (b"GET /status HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
        (
            b"POST /coflows HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n" + b"a" * 70_000,
            b"413",
        ),
        (b"POST /coflows HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", b"405"),
        (b"GET /status HTTP/1.0\r\n\r\n", b"200"),
    ],
)
def test_malformed_and_oversized_requests_get_one_answer_and_the_server_goes_on(
    plain_rest, request_bytes, status
):
    _, port = plain_rest
    reply = raw_exchange(port, request_bytes)
    assert reply.split(b" ", 2)[1] == status, reply[:200]
    assert b"Connection: close" in reply
    assert raw_exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 OK")


def test_a_trickling_peer_is_cut_off_and_the_loop_serves_meanwhile(plain_rest, monkeypatch):
    """REST runs on the controller's loop: a peer sending half a request holds neither the
    loop nor other requests, and is closed at the whole-request deadline."""
    import terra_controller.rest as rest_module

    monkeypatch.setattr(rest_module, "REQUEST_TIMEOUT_S", 0.5)
    controller, port = plain_rest
    with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
        slow.sendall(b"GET /sta")
        t0 = time.monotonic()
        assert raw_exchange(port, b"GET /status HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert controller.owner.run(lambda: controller.owner.on_loop)
        assert slow.recv(100) == b""  # closed without an answer
        assert 0.3 < time.monotonic() - t0 < 4.0


def test_an_application_that_raises_gets_500_and_the_loop_serves_on():
    """Below the app's own error answers: a WSGI app that raises (or returns headers h11
    refuses) answers 500 on the loop, and the next request is served."""
    links = {("A", "B"): CAP, ("B", "A"): CAP}
    topology = Topology("pair", ["A", "B"], links)
    controller = Controller(topology, TerraPolicy(topology, k=1))
    calls = []

    def app(environ, start_response):
        calls.append(environ["PATH_INFO"])
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("a failing application")
        if environ["PATH_INFO"] == "/bad-header":
            start_response("200 OK", [("X-Bad", "a\r\nb")])
            return [b"x"]
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    server, _, (_, port) = start_rest_server(
        app, "127.0.0.1", 0, None, True, daemon_spawn, listeners={}, owner=controller.owner
    )
    try:
        for path in ("/boom", "/bad-header"):
            reply = raw_exchange(port, f"GET {path} HTTP/1.0\r\n\r\n".encode())
            assert reply.startswith(b"HTTP/1.1 500 "), reply[:100]
        assert raw_exchange(port, b"GET /fine HTTP/1.0\r\n\r\n").endswith(b"\r\n\r\nok")
        assert calls == ["/boom", "/bad-header", "/fine"]
    finally:
        server.shutdown()
        controller.close()
