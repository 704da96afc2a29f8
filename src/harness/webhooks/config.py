"""The webhook configuration: approver endpoints per tenant and role, the Callers' signing secrets, the
console links and the retry schedule.

A webhooks file is YAML::

    console_url: https://harness.example.com       # base of the approve / reject links
    callback_secrets:                              # signs the events sent to a Run's callback
      acme: {secret_env: HARNESS_WEBHOOK_SECRET_ACME}
      "*": {secret_env: HARNESS_WEBHOOK_SECRET}    # any other tenant
    callback_hosts: [hooks.acme.example]           # optional: the only hosts a callback may name
    internal_callbacks:                            # optional: internal receivers a tenant may reach
      acme: [hooks.acme.internal, 10.20.0.0/16]    # host names, addresses or networks ("*": any)
    approvers:
      - name: acme-leads
        tenant: acme
        role: support_lead
        url: https://chat.acme.example/hooks/approvals
        secret_file: /run/secrets/acme-leads      # or secret_env: NAME
    delivery: {max_attempts: 8, backoff_s: 5, max_backoff_s: 3600, timeout_s: 10}

Secrets are Standard Webhooks secrets (``whsec_`` and base64). They never sit in the file itself: each
names the environment variable or the file that holds it, and they are read once, when the file loads.
Without a file, ``HARNESS_WEBHOOK_SECRET`` (if set) signs every tenant's callbacks and no approver is
configured.

A callback or an approver endpoint reaches public addresses only (harness.domain.outbound): one that is, or
resolves to, a loopback, private, link-local or otherwise internal address is refused at intake and at
every send. ``internal_callbacks`` opts a tenant (or ``"*"``, every tenant) in to internal receivers; the
environment variable ``HARNESS_CALLBACK_ALLOW_INTERNAL`` (comma-separated entries, ``*`` for any internal
address) does the same for every tenant.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from standardwebhooks import Webhook

from harness.domain.contracts import IDENT, check_callback_url
from harness.domain.durations import Seconds
from harness.domain.errors import BadInputError
from harness.domain.outbound import OutboundGuard, OutboundRule, OutboundUnresolvedError
from harness.domain.webhooks import DEFAULT_SECRET_ENV, MAX_SEND_TIMEOUT_S
from harness.yamlfile import load_yaml_model

#: the environment variable whose secret signs callbacks when no webhooks file says otherwise
ANY_TENANT = "*"
#: the environment variable whose entries (hosts, addresses, networks, or *) every tenant may reach inside
ALLOW_INTERNAL_ENV = "HARNESS_CALLBACK_ALLOW_INTERNAL"
Url = Annotated[str, AfterValidator(check_callback_url)]


def _allow_list(entries: tuple[str, ...]) -> tuple[str, ...]:
    OutboundRule.parse(entries)  # ValueError naming the entry that is not a host, an address or a network
    return entries


AllowList = Annotated[tuple[str, ...], AfterValidator(_allow_list)]


class WebhookConfigError(BadInputError):
    """A webhooks file, or a secret it names, that cannot be used."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """Where a signing secret is: an environment variable or a file (never the secret itself)."""

    secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    secret_file: Path | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("name exactly one of secret_env and secret_file")
        return self

    def describe(self) -> str:
        """Where the secret comes from, for error messages (never its value)."""
        return f"${self.secret_env}" if self.secret_env else f"the file {self.secret_file}"

    def read(self) -> str:
        """The secret, checked to be a usable Standard Webhooks secret."""
        if self.secret_env is not None:
            value = os.environ.get(self.secret_env, "").strip()
        else:
            assert self.secret_file is not None
            try:
                value = self.secret_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise WebhookConfigError(f"cannot read the webhook secret in {self.secret_file}: "
                                         f"{exc.strerror}") from exc
            except UnicodeDecodeError:
                raise WebhookConfigError(f"the webhook secret in {self.secret_file} is not UTF-8 text") from None
        if not value:
            raise WebhookConfigError(f"the webhook secret in {self.describe()} is empty or unset")
        try:
            Webhook(value)
        except Exception:  # the library raises bare binascii/ValueErrors: say what is wrong, not the value
            raise WebhookConfigError(f"the webhook secret in {self.describe()} is not a Standard Webhooks "
                                     "secret (whsec_ followed by base64)") from None
        return value


class ApproverEndpoint(SecretRef):
    """Where a tenant's approvers of one role are told about approval requests."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    tenant: str = Field(pattern=IDENT)
    role: str = Field(pattern=IDENT)
    url: Url

    @property
    def key(self) -> str:
        """The endpoint's name in the outbox (what a delivery is addressed to)."""
        return f"approver:{self.name}"


class Delivery(_Strict):
    """The retry schedule: attempt n waits backoff_s * 2**(n-1) (at most max_backoff_s) after attempt n-1;
    after max_attempts the delivery is dead (kept, listed, redeliverable). Each duration is at most
    MAX_DURATION_S (366 days)."""

    max_attempts: int = Field(default=8, ge=1, le=100)
    backoff_s: Seconds = 5.0
    max_backoff_s: Seconds = 3600.0
    timeout_s: float = Field(default=10.0, gt=0, le=MAX_SEND_TIMEOUT_S)
    #: a claimed delivery is another process's again after this long (it must outlast one send)
    lease_s: Seconds | None = None
    batch: int = Field(default=50, ge=1, le=1000)

    @property
    def lease(self) -> float:
        """How long a claim holds: by default three send timeouts."""
        return self.lease_s if self.lease_s is not None else 3 * self.timeout_s + 5

    @model_validator(mode="after")
    def _lease_outlasts_a_send(self) -> Delivery:
        if self.lease_s is not None and self.lease_s <= self.timeout_s:
            raise ValueError("lease_s must be longer than timeout_s, or two processes could send one event at once")
        return self


class WebhookConfig(_Strict):
    """The whole webhooks configuration; secrets are read when it loads (`load_webhook_config`)."""

    console_url: Url = "http://127.0.0.1:8000"
    callback_secrets: dict[str, SecretRef] = Field(default_factory=dict)
    callback_hosts: tuple[str, ...] = ()
    internal_callbacks: dict[str, AllowList] = Field(default_factory=dict)
    approvers: tuple[ApproverEndpoint, ...] = ()
    delivery: Delivery = Delivery()
    _secrets: dict[str, str] = PrivateAttr(default_factory=dict)
    _allow_internal: OutboundRule = PrivateAttr(default_factory=OutboundRule)

    @model_validator(mode="after")
    def _unique_names(self) -> WebhookConfig:
        names = [a.name for a in self.approvers]
        if len(set(names)) != len(names):
            raise ValueError(f"approver endpoint names must be unique, got {names}")
        return self

    def __repr__(self) -> str:  # the secrets are private attributes, but say so plainly
        return f"WebhookConfig(approvers={[a.name for a in self.approvers]}, secrets=<hidden>)"

    def load_secrets(self) -> WebhookConfig:
        """Read every secret now, so a missing or malformed one is an error at start, not at send time."""
        for tenant, ref in self.callback_secrets.items():
            self._secrets[f"caller:{tenant}"] = ref.read()
        for endpoint in self.approvers:
            self._secrets[endpoint.key] = endpoint.read()
        try:
            self._allow_internal = OutboundRule.parse(os.environ.get(ALLOW_INTERNAL_ENV, "").split(","))
        except ValueError as exc:
            raise WebhookConfigError(f"{ALLOW_INTERNAL_ENV}: {exc}") from None
        return self

    # ------------------------------------------------------------------ what the notifier asks

    def sends_anything(self) -> bool:
        """Whether any notification can go anywhere: an approver endpoint, or a secret to sign callbacks
        with (a Run's callback is refused at intake, and never sent, without one)."""
        return bool(self.approvers or self._secrets)

    def approvers_for(self, tenant_id: str, roles: tuple[str, ...]) -> list[ApproverEndpoint]:
        """The endpoints of this tenant's approvers holding one of `roles`."""
        return [a for a in self.approvers if a.tenant == tenant_id and a.role in roles]

    def caller_endpoint(self, tenant_id: str) -> str | None:
        """The outbox endpoint name whose secret signs this tenant's callbacks; None when none does."""
        for key in (f"caller:{tenant_id}", f"caller:{ANY_TENANT}"):
            if key in self._secrets:
                return key
        return None

    def secret(self, endpoint: str) -> str | None:
        """The signing secret of an outbox endpoint; None when it is no longer configured."""
        return self._secrets.get(endpoint)

    def outbound_rule(self, tenant_id: str) -> OutboundRule:
        """The internal receivers this tenant's callbacks and approver endpoints may reach."""
        rule = self._allow_internal
        for key in (tenant_id, ANY_TENANT):
            rule = rule.merge(OutboundRule.parse(self.internal_callbacks.get(key, ())))
        return rule

    def check_callback(self, tenant_id: str, url: str, guard: OutboundGuard | None = None) -> None:
        """Refuse a callback this deployment cannot sign or does not allow (BadInputError naming why): with
        a `guard`, one that is or resolves to an internal address the tenant may not reach (a name that
        does not resolve yet passes: every send checks again)."""
        if self.caller_endpoint(tenant_id) is None:
            raise BadInputError(f"callback: no webhook signing secret is configured for tenant {tenant_id!r}; "
                                f"set {DEFAULT_SECRET_ENV} or callback_secrets in the webhooks file")
        host = (urllib.parse.urlsplit(url).hostname or "").lower()
        if self.callback_hosts and host not in {h.lower() for h in self.callback_hosts}:
            raise BadInputError(f"callback: the host {host!r} is not among this deployment's allowed callback "
                                "hosts")
        if guard is not None:
            try:
                guard.addresses(host, self.outbound_rule(tenant_id))
            except OutboundUnresolvedError:
                pass
            except BadInputError as exc:
                raise BadInputError(f"callback: {exc}") from None

    def console_link(self, path: str) -> str:
        """An absolute console URL."""
        return self.console_url.rstrip("/") + path


def load_webhook_config(path: Path | None) -> WebhookConfig:
    """The webhooks file at `path` with its secrets read; without a file, HARNESS_WEBHOOK_SECRET (if set)
    signs every tenant's callbacks."""
    if path is not None:
        config = load_yaml_model(path, WebhookConfig, "the webhooks file", WebhookConfigError)
        console = os.environ.get("HARNESS_CONSOLE_URL")
        if console and "console_url" not in config.model_fields_set:
            config = config.model_copy(update={"console_url": check_callback_url(console)})
    else:
        refs = {ANY_TENANT: SecretRef(secret_env=DEFAULT_SECRET_ENV)} if os.environ.get(DEFAULT_SECRET_ENV) else {}
        config = WebhookConfig(callback_secrets=refs,
                               console_url=os.environ.get("HARNESS_CONSOLE_URL") or "http://127.0.0.1:8000")
    return config.load_secrets()
