"""Which addresses an outbound request may reach (server-side request forgery).

A URL a tenant gives harness (a Run's callback, a webhook endpoint) is a request harness makes on its
behalf, from inside the deployment's network. By default it may reach public addresses only: a host that
is, or resolves to, a loopback, private, shared, link-local, multicast, unspecified or otherwise reserved
address (IPv4 or IPv6, however it is spelled: ``localhost``, ``127.1``, ``0x7f000001``, ``2130706433``,
``0177.0.0.1``, ``::ffff:127.0.0.1``, ``[::1]``) is refused. An operator opts a tenant in to internal
receivers with an `OutboundRule`: host names, addresses or networks it may reach, or ``*`` for any.
Checkpoint witness URLs, which the operator configures, follow the same rule with their own allow-list
(``HARNESS_WITNESS_ALLOW_INTERNAL``, harness.settings).

This module decides; it does no I/O. The name is resolved by the caller (`OutboundGuard` takes the
resolver), and the adapter that sends connects to the very address that was checked, so a name that
resolves to a public address when checked and to an internal one a moment later (DNS rebinding) reaches
nothing it was not allowed to.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from harness.domain.errors import BadInputError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: resolves a host name to its addresses (as text); raises OSError when it cannot
Resolver = Callable[[str], Sequence[str]]
#: the allow-list entry that lets a tenant reach any internal address
ANY = "*"
#: how an operator lets callbacks and webhooks reach an internal receiver (the refusal names it)
CALLBACK_REMEDY = ("callbacks and webhooks may only reach public addresses unless the operator allows this tenant "
                   "internal receivers (internal_callbacks in the webhooks file, or HARNESS_CALLBACK_ALLOW_INTERNAL)")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: names that are the local machine whatever a resolver says
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_LOOPBACK: tuple[Address, ...] = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


class OutboundRefusedError(BadInputError):
    """An outbound URL whose host is, or resolves to, an address this tenant may not reach."""


class OutboundUnresolvedError(BadInputError):
    """An outbound URL whose host name does not resolve."""


class OutboundInvalidHostError(OutboundRefusedError):
    """An outbound URL whose host is no address and no name a resolver can be asked for (an empty label, a
    label over 63 characters): it can never be reached, so it is refused rather than tried."""


#: the longest host name DNS carries, and the longest label in it (RFC 1035), counted once encoded
MAX_HOST_NAME = 253
MAX_LABEL = 63


def is_valid_host(host: str) -> bool:
    """Whether `host` is an address (any spelling `literal_address` takes) or a name a resolver can be asked
    for: labels of 1 to 63 characters once encoded for DNS (IDNA, as the resolver encodes it), 253 in all,
    a final dot allowed."""
    if literal_address(host) is not None:
        return True
    name = host[:-1] if host.endswith(".") else host
    try:
        encoded = name.encode("idna")  # what the system resolver does first, raising for a bad label
    except UnicodeError:
        return False
    return 0 < len(encoded) <= MAX_HOST_NAME and all(0 < len(label) <= MAX_LABEL for label in encoded.split(b"."))


def literal_address(host: str) -> Address | None:
    """The address `host` spells, in any of the forms a resolver accepts (dotted, short ``127.1``, hex,
    octal, one decimal number, bracketed or zoned IPv6); None for a host name."""
    text = host.strip().strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        pass
    try:  # inet_aton takes the legacy spellings (127.1, 0x7f000001, 2130706433, 0177.0.0.1) as resolvers do
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


def _embedded(address: Address) -> Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_internal(address: Address) -> bool:
    """Whether `address` is anything but a public unicast address: loopback, private, shared (100.64/10),
    link-local, multicast, unspecified, reserved, or an IPv6 address carrying such an IPv4 address."""
    inner = _embedded(address)
    if inner is not None and is_internal(inner):
        return True
    return (not address.is_global or address.is_multicast or address.is_loopback or address.is_private
            or address.is_link_local or address.is_reserved or address.is_unspecified)


@dataclass(frozen=True)
class OutboundRule:
    """The internal targets one tenant may reach: host names, and addresses or networks (``*`` for any)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    any_internal: bool = False

    @classmethod
    def parse(cls, entries: Iterable[str]) -> OutboundRule:
        """A rule from allow-list entries: ``*``, a host name, an address, or a network in CIDR form
        (ValueError naming an entry that is none of these)."""
        hosts: set[str] = set()
        networks: list[Network] = []
        any_internal = False
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry == ANY:
                any_internal = True
            elif "/" in entry or literal_address(entry) is not None:
                try:
                    networks.append(ipaddress.ip_network(entry.replace("[", "").replace("]", "") if "/" in entry
                                                         else str(literal_address(entry)), strict=False))
                except ValueError:
                    raise ValueError(f"{raw!r} is not a network (address/prefix)") from None
            elif _is_host_name(entry):
                hosts.add(entry.rstrip("."))
            else:
                raise ValueError(f"{raw!r} is neither a host name, an address nor a network")
        return cls(frozenset(hosts), tuple(networks), any_internal)

    def merge(self, other: OutboundRule) -> OutboundRule:
        """Both rules' allowances."""
        return OutboundRule(self.hosts | other.hosts, self.networks + other.networks,
                            self.any_internal or other.any_internal)

    def allows_host(self, host: str) -> bool:
        """Whether the host name itself is allowed, whatever it resolves to."""
        return self.any_internal or host.lower().rstrip(".") in self.hosts

    def allows_address(self, address: Address) -> bool:
        """Whether an internal address is inside an allowed network."""
        return self.any_internal or any(address.version == n.version and address in n for n in self.networks)


#: the default: public addresses only
PUBLIC_ONLY = OutboundRule()


def _is_host_name(text: str) -> bool:
    labels = text.rstrip(".").split(".")
    return all(0 < len(label) <= 63 and all(c.isalnum() or c in "-_" for c in label) for label in labels)


@dataclass(frozen=True)
class OutboundGuard:
    """Checks outbound hosts against the default rule and one tenant's allowances."""

    resolve: Resolver
    #: what a refusal tells the operator to do to allow the host
    remedy: str = CALLBACK_REMEDY

    def addresses(self, host: str, rule: OutboundRule) -> list[Address]:
        """The addresses `host` may be reached at, every one checked; `OutboundRefusedError` if any of them (or the
        name itself, for the local machine's names) is internal and not allowed, or (`OutboundInvalidHostError`)
        if it is no valid host name; `OutboundUnresolvedError` if the name does not resolve. A resolver's
        answer that mixes public and internal addresses is refused: a name pointing inside the network is not
        made safe by also pointing outside it."""
        host = host.lower().rstrip(".")
        literal = literal_address(host)
        if literal is not None:
            found = [literal]
        elif not is_valid_host(host):  # no resolver is asked for a name it cannot even encode
            raise OutboundInvalidHostError(f"the host {host!r} is not a valid host name")
        elif host in _LOCAL_NAMES or host.endswith(".localhost"):  # never asked: these are this machine
            found = [a for a in _LOOPBACK if rule.allows_host(host) or rule.allows_address(a)] or list(_LOOPBACK)
        else:
            try:
                found = _unique(literal_address(a) for a in self.resolve(host))
            except OSError:
                raise OutboundUnresolvedError(f"the host {host!r} does not resolve") from None
            if not found:
                raise OutboundUnresolvedError(f"the host {host!r} does not resolve")
        if literal is None and rule.allows_host(host):
            return found
        for address in found:
            if is_internal(address) and not rule.allows_address(address):
                where = "" if literal is not None else f" (it resolves to {address})"
                raise OutboundRefusedError(f"the host {host!r} is an internal address{where}; {self.remedy}")
        return found


def _unique(addresses: Iterable[Address | None]) -> list[Address]:
    seen: list[Address] = []
    for address in addresses:
        if address is not None and address not in seen:
            seen.append(address)
    return seen


def pinned(url: str, address: Address) -> tuple[str, dict[str, str], dict[str, str]]:
    """`url` addressed to `address`, with the Host header and the TLS server name that keep the URL's own
    name: the URL to request, the headers and the request extensions."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    named = f"[{host}]" if ":" in host else host
    host_header = named if parts.port is None else f"{named}:{parts.port}"
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), {"host": host_header}, extensions
