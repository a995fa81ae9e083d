"""REST tokens (terra_security/tokens.py): signed with the controller's key, expiring,
carrying the certificate's name and role; anything else is refused."""

import pytest

from terra_security.pki import Identity, Role
from terra_security.tokens import MAX_TTL_S, TokenError, issue_token, new_key, verify_token

OPERATOR = Identity("ops", Role.OPERATOR)


def test_a_token_gives_back_the_name_and_role_until_it_expires():
    key = new_key()
    token, expires = issue_token(key, OPERATOR, ttl_s=60, now=1000.0)
    assert expires == 1060
    assert verify_token(key, token, now=1059.9) == OPERATOR
    with pytest.raises(TokenError, match="expired"):
        verify_token(key, token, now=1060.0)
    job, _ = issue_token(key, Identity("etl", Role.JOB), now=1000.0)
    assert verify_token(key, job, now=1001.0) == Identity("etl", Role.JOB)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-2] + ("AA" if t[-2:] != "AA" else "BB"),  # signature altered
        lambda t: t.replace("terra1.", "terra2."),
        lambda t: t + ".x",
        lambda t: "",
        lambda t: t.split(".")[0] + "." + t.split(".")[1] + ".!!",
        lambda t: "é" + t,
        lambda t: t * 20,  # too long
    ],
)
def test_altered_tokens_are_refused(mangle):
    key = new_key()
    token, _ = issue_token(key, OPERATOR)
    with pytest.raises(TokenError):
        verify_token(key, mangle(token))


def test_another_key_or_a_non_string_is_refused_and_lifetimes_are_bounded():
    token, _ = issue_token(new_key(), OPERATOR)
    with pytest.raises(TokenError, match="signature"):
        verify_token(new_key(), token)
    with pytest.raises(TokenError):
        verify_token(new_key(), None)
    for ttl in (0, -5, MAX_TTL_S + 1, True, "60"):
        with pytest.raises(TokenError):
            issue_token(new_key(), OPERATOR, ttl_s=ttl)
