"""Operator login for the web console against a real controller (mutual TLS, client
certificates optional on REST, not --rest-public): `terra-controller ctl login` with an
operator certificate prints a token; a browser without any certificate signs in with it and
sees the page's data. A job certificate's token is refused by REST (403), as the job's
certificate is."""

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from benchmarks.loopback_system import OPERATOR, ControllerProcess
from benchmarks.web_page import PageSession
from mininet_scenarios.browser import browser_missing, start_browser
from terra_security.pki import Role


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    c = ControllerProcess("swan", log=tmp_path_factory.mktemp("login") / "ctl.log")
    yield c
    c.stop()


def login(ctl: ControllerProcess, name: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "ctl", "--api", ctl.api, "--pki",
         str(ctl.pki), "--name", name, "login"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def read(ctl: ControllerProcess, path: str, token: str | None) -> tuple[int, dict]:
    """GET over TLS without a client certificate (the CA verified), with a Bearer token."""
    import ssl

    context = ssl.create_default_context(cafile=str(ctl.pki / "ca.crt"))
    context.check_hostname = False
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(ctl.rest + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_ctl_login_gives_a_token_rest_accepts_with_the_certificates_role(ctl):
    granted = login(ctl, OPERATOR)
    assert granted["name"] == OPERATOR and granted["role"] == "operator"
    assert read(ctl, "/status", None)[0] == 401
    code, status = read(ctl, "/status", granted["token"])
    assert code == 200 and status["topology"] == "swan"
    job = login(ctl, ctl.identity(Role.JOB, "etl"))
    assert job["role"] == "job"
    code, reply = read(ctl, "/coflows", job["token"])
    assert code == 403 and "job" in reply["error"]
    assert read(ctl, "/events", job["token"])[0] == 403  # every JSON route, not only some


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_a_browser_without_a_certificate_signs_in_with_the_token(ctl):
    token = login(ctl, OPERATOR)["token"]
    driver = start_browser()
    try:
        driver.get(ctl.rest + "/")
        PageSession.wait(lambda: driver.find_element("id", "login").is_displayed(), 60,
                         "the login box")  # fmt: skip
        assert driver.find_element("id", "topology-name").text == "…"  # no data without it
        driver.find_element("id", "login-token").send_keys(token)
        driver.find_element("id", "login-button").click()
        PageSession.wait(lambda: driver.find_element("id", "topology-name").text == "swan", 60,
                         "the page's data")  # fmt: skip
        assert not driver.find_element("id", "login").is_displayed()
        # A wrong token brings the box back with the reason.
        driver.execute_script("sessionStorage.setItem('terra-token', 'terra1.x.y')")
        PageSession.wait(lambda: driver.find_element("id", "login").is_displayed(), 60,
                         "the login box again")  # fmt: skip
        assert "refused" in driver.find_element("id", "login-note").text
    finally:
        driver.quit()
