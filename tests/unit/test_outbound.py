"""The outbound guard (harness.domain.outbound): which hosts a tenant's callbacks and webhooks may reach."""

from __future__ import annotations

import ipaddress

import pytest

from harness.domain.outbound import (
    OutboundGuard,
    OutboundInvalidHostError,
    OutboundRefusedError,
    OutboundRule,
    OutboundUnresolvedError,
    is_internal,
    is_valid_host,
    literal_address,
)

NAMES = {"public.test": ["93.184.216.34"], "inside.test": ["10.0.0.7"], "mixed.test": ["93.184.216.34", "127.0.0.1"],
         "v6.test": ["2606:4700::1111"], "metadata.test": ["169.254.169.254"]}


def resolve(host: str) -> list[str]:
    if host not in NAMES:
        raise OSError("no such name")
    return NAMES[host]


GUARD = OutboundGuard(resolve)
DEFAULT = OutboundRule()


@pytest.mark.parametrize("host", [
    "localhost", "LOCALHOST.", "api.localhost", "127.0.0.1", "127.1", "0x7f000001", "2130706433", "0177.0.0.1",
    "0x7f.1", "::1", "::ffff:127.0.0.1", "::ffff:7f00:1", "0.0.0.0", "0", "::", "10.1.2.3", "172.16.0.1",
    "192.168.1.1", "100.64.0.1", "169.254.169.254", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12::1",
    "224.0.0.1", "ff02::1", "240.0.0.1", "255.255.255.255", "2002:7f00:1::", "64:ff9b::a9fe:a9fe",
    "2001:0:4136:e378:8000:63bf:80ff:fffe", "inside.test", "mixed.test", "metadata.test"])
def test_internal_targets_are_refused_by_default(host: str) -> None:
    """Loopback, private, shared, link-local, multicast, unspecified and reserved addresses, however spelled
    or reached through a name, are refused without an allowance."""
    with pytest.raises(OutboundRefusedError, match="internal_callbacks"):
        GUARD.addresses(host, DEFAULT)


@pytest.mark.parametrize(("host", "expected"), [
    ("public.test", "93.184.216.34"), ("v6.test", "2606:4700::1111"), ("8.8.8.8", "8.8.8.8"),
    ("2606:4700:4700::1111", "2606:4700:4700::1111")])
def test_public_targets_pass_with_the_address_to_connect_to(host: str, expected: str) -> None:
    """A public host passes, and the guard names the checked address the sender connects to."""
    assert [str(a) for a in GUARD.addresses(host, DEFAULT)] == [expected]


def test_a_name_that_does_not_resolve_is_told_apart() -> None:
    """An unresolvable name is its own outcome (intake lets it pass; every send checks again)."""
    with pytest.raises(OutboundUnresolvedError):
        GUARD.addresses("nowhere.test", DEFAULT)


def test_an_allowance_opens_exactly_what_it_names() -> None:
    """A network allows the addresses in it (whatever the spelling), a host name allows that name, ``*``
    allows everything; anything else stays refused."""
    loopback = OutboundRule.parse(["127.0.0.0/8"])
    assert [str(a) for a in GUARD.addresses("0x7f000001", loopback)] == ["127.0.0.1"]
    assert [str(a) for a in GUARD.addresses("localhost", loopback)] == ["127.0.0.1"]
    with pytest.raises(OutboundRefusedError):
        GUARD.addresses("10.0.0.7", loopback)
    assert [str(a) for a in GUARD.addresses("inside.test", OutboundRule.parse(["inside.test"]))] == ["10.0.0.7"]
    with pytest.raises(OutboundRefusedError):
        GUARD.addresses("metadata.test", OutboundRule.parse(["inside.test"]))
    assert GUARD.addresses("169.254.169.254", OutboundRule.parse(["*"]))
    with pytest.raises(ValueError, match="neither"):
        OutboundRule.parse(["not a host!"])


def test_every_spelling_is_the_address_a_resolver_would_reach() -> None:
    """The short, hex, octal and single-number IPv4 forms read as the address glibc connects to."""
    assert {str(literal_address(s)) for s in ("127.1", "0x7f000001", "2130706433", "0177.0.0.1")} == {"127.0.0.1"}
    assert literal_address("hooks.example.com") is None
    assert not is_internal(ipaddress.ip_address("93.184.216.34"))


@pytest.mark.parametrize("host", [f"{'a' * 64}.com", "a..b", ".example.com", f"{'ü' * 60}.de",
                                  ".".join(["a" * 60] * 5), ""])
def test_a_host_no_resolver_can_be_asked_for_is_refused_before_asking(host: str) -> None:
    """A host with an empty label, a label over 63 characters (once encoded) or a name over 253 is refused
    as no valid host name, whatever the rule allows, and the resolver is never called with it."""
    asked: list[str] = []

    def resolver(name: str) -> list[str]:
        asked.append(name)
        return ["93.184.216.34"]

    guard = OutboundGuard(resolver)
    assert not is_valid_host(host)
    for rule in (DEFAULT, OutboundRule(any_internal=True)):
        with pytest.raises(OutboundInvalidHostError, match="not a valid host name"):
            guard.addresses(host, rule)
    assert asked == []


@pytest.mark.parametrize("host", [f"{'a' * 63}.com", "bücher.de", "example.com.", "127.0.0.1", "::1", "a_b.test"])
def test_valid_host_names_and_addresses_are_valid(host: str) -> None:
    """Labels of up to 63 characters, international names, a final dot and addresses are valid hosts."""
    assert is_valid_host(host)
