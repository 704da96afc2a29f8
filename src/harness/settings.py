"""Settings: how a harness process is configured (SPEC D1).

Every setting has an environment variable; the defaults are the embedded default — a SQLite file in
the working directory, the scripted LLM and the bundled support example's skills and policies. A YAML file
(HARNESS_CONFIG_FILE) may hold them too. The composition root (harness.config) builds a Runtime from them.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.domain.contracts import DEFAULT_CHAIN_DEPTH, DEFAULT_MAX_ROUNDS, MAX_CHAIN_DEPTH, MAX_ROUNDS
from harness.domain.durations import Seconds, SecondsOrZero
from harness.domain.errors import InvalidRequestError
from harness.domain.limits import RequestLimits
from harness.domain.outbound import (
    OutboundGuard,
    OutboundRefusedError,
    OutboundRule,
    OutboundUnresolvedError,
    Resolver,
)
from harness.domain.sandbox import PoolSettings
from harness.examples.support import EXAMPLE_DIR
from harness.kernel.thresholds import (
    DEFAULT_EXECUTION_LIMIT_S,
    SWEEP_INTERVAL_S,
    Thresholds,
    parse_overrides,
)
from harness.paths import default_data_dir
from harness.yamlfile import read_yaml

#: the largest heartbeat ceiling factor: a heartbeating Run is forced on past this many times its threshold
MAX_CEILING_FACTOR = 1000.0


class Settings(BaseModel):
    """How a harness process is configured. Every duration (a setting ending in `_s`, and each of
    `state_thresholds`) is a finite number of seconds of at most MAX_DURATION_S (366 days): infinity, NaN or
    a number like 1e300 is refused when the settings load, naming the setting, not met later as an overflow
    in a timer or a date."""

    model_config = ConfigDict(extra="forbid")
    db: str | None = None
    #: the agent: `module:attr` (an Agent in Python) or the path of an agent file (YAML: name, instructions,
    #: model, skills, policy); None: the bundled support agent, unless skills, policy, rules or identities
    #: are set one by one
    agent: Path | str | None = None
    skills_dirs: tuple[Path, ...] = (EXAMPLE_DIR / "skills",)
    #: installed packages whose modules may be skill entrypoints (besides files in a skill's folder)
    skill_packages: tuple[str, ...] = ()
    policy_file: Path = EXAMPLE_DIR / "policy.yaml"
    #: "local": an OpenAI-compatible server of a model on this machine (llama-cpp-python's, see
    #: docs/local-model.md), at llm_base_url (default http://127.0.0.1:8080/v1), needing no API key
    llm: Literal["scripted", "openai", "anthropic", "local"] = "scripted"
    llm_rules: Path = EXAMPLE_DIR / "llm_rules.yaml"
    # The real providers (openai, anthropic): model, optional fallback model, endpoint, the name of the
    # environment variable holding the key (the key itself never sits in settings), prices per model.
    llm_model: str | None = None
    llm_fallback_model: str | None = None
    llm_base_url: str | None = None
    llm_api_key_env: str | None = None
    llm_pricing: Path | None = None
    llm_stream: bool = False
    llm_plan_mode: Literal["json", "tool"] = "json"
    llm_timeout_s: Seconds = 60.0
    #: how the plan is asked for (None: json_schema for openai, json_object with a schema for local), whether
    #: the skills are described in the system prompt instead of sent as tools (None: only for local), and
    #: the most tokens an answer may take (None: 512 for local, else as the context budget allows)
    llm_plan_format: Literal["json_schema", "json_object", "none"] | None = None
    llm_tools_in_prompt: bool | None = None
    llm_max_tokens: int | None = Field(default=None, gt=0)
    #: the most steps the plan's schema admits (None: 1 for local, a small model repeats steps; else 8)
    llm_plan_max_steps: int | None = Field(default=None, ge=1, le=64)
    #: nucleus sampling sent with every request to an OpenAI-compatible model (the Anthropic messages API
    #: takes none); None: not sent, the model's own default applies
    llm_top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    identities_file: Path = EXAMPLE_DIR / "identities.yaml"
    #: Runs' working directories and the bundled example's ledger (HARNESS_DATA_DIR)
    data_dir: Path = Field(default_factory=default_data_dir)
    execution_limit_s: Seconds = DEFAULT_EXECUTION_LIMIT_S
    #: how many levels of child Runs (AgentInvoke) a Run may start when its caller gives no
    #: chain_remaining, and the most a caller may give
    chain_depth: int = Field(default=DEFAULT_CHAIN_DEPTH, ge=0, le=MAX_CHAIN_DEPTH)
    #: how many rounds a Run may plan (each round's results are shown to the model before the next)
    max_rounds: int = Field(default=DEFAULT_MAX_ROUNDS, ge=1, le=MAX_ROUNDS)
    sandbox: Literal["auto", "bwrap", "rlimit"] = "auto"
    #: where sandboxed calls run: "local" (this host) or "remote" (a `harness sandbox serve` at sandbox_url,
    #: authenticated by HARNESS_SANDBOX_TOKEN); with "local", the tenants and skills listed in
    #: sandbox_remote_tenants / sandbox_remote_skills (comma-separated in the environment) run remotely
    sandbox_provider: Literal["local", "remote"] = "local"
    sandbox_url: str | None = None
    sandbox_remote_tenants: tuple[str, ...] = ()
    sandbox_remote_skills: tuple[str, ...] = ()
    #: sandboxes as a scarce resource: this host's name (instances, caps and the port pool are per host),
    #: how many instances may live at once on it and per tenant, its port range ("41000-41255"; "" for
    #: none), and how long an instance's lease lives without this host renewing it
    sandbox_host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=100)
    sandbox_host_cap: int = Field(default=32, ge=1, le=10_000)
    sandbox_tenant_cap: int = Field(default=16, ge=1, le=10_000)
    sandbox_ports: str = "41000-41255"
    sandbox_lease_s: Seconds = 300.0
    #: what a sandboxed call leaves besides its output: the most bytes of its stdout, and of its stderr, its
    #: outcome keeps (the start and the end of a longer stream); the largest file it wrote that is kept, and
    #: how many files of one call are kept (the rest are listed as skipped, with the reason)
    sandbox_stream_bytes: int = Field(default=16_384, ge=256, le=16 * 1024 * 1024)
    artifact_max_bytes: int = Field(default=10 * 1024 * 1024, ge=0, le=1024 * 1024 * 1024)
    artifact_max_count: int = Field(default=20, ge=0, le=10_000)
    #: where the kept files' bytes go: a directory (a path or file://) or an S3-compatible bucket
    #: (s3://bucket/prefix, at HARNESS_ARCHIVE_S3_ENDPOINT); None: into the database, with the Run's contents
    artifact_store: str | None = None

    @field_validator("sandbox_ports")
    @classmethod
    def _port_range(cls, value: str) -> str:
        parse_port_range(value)
        return value

    def pool_settings(self) -> PoolSettings:
        """The sandbox pool these settings describe."""
        return PoolSettings(host=self.sandbox_host, host_cap=self.sandbox_host_cap,
                            tenant_cap=self.sandbox_tenant_cap, port_range=parse_port_range(self.sandbox_ports),
                            lease_s=self.sandbox_lease_s)
    #: Redis Streams between the outbox and the hash chain (SPEC D2), e.g. redis://127.0.0.1:6379/0;
    #: None drains the outbox straight into the chain
    trace_buffer: str | None = None
    #: context assembler (SPEC C1-C5): token encoding ("auto" follows the provider and model), memory
    #: recall mode, where a succeeded Run's summary is written back, the budget share memory may take
    tokenizer: Literal["auto", "cl100k_base", "o200k_base", "approx"] = "auto"
    memory: Literal["off", "lexical", "semantic"] = "lexical"
    memory_write_scope: Literal["user", "session"] = "user"
    memory_share: float = Field(default=0.25, ge=0.0, le=0.9)
    #: how many of a scope's newest entries a lexical recall ranks (those of them sharing a word with the
    #: query): one recall's cost stays bounded as the memory grows
    memory_recall_window: int = Field(default=1000, ge=10, le=1_000_000)
    #: knowledge bases in the context: how chunks are searched ("off" gives the model none), and the share
    #: of the token budget their snippets may take
    knowledge: Literal["off", "lexical", "semantic"] = "lexical"
    knowledge_share: float = Field(default=0.25, ge=0.0, le=0.9)
    #: leases (one driver per Run): how long a driver's lease lives without a heartbeat (it heartbeats
    #: every third of it; at most 366 days, like every duration here), and how many times a Run's lease may
    #: be taken over from a dead driver before the Run is failed as poison instead of resumed again
    lease_ttl_s: Seconds = 30.0
    max_stalls: int = Field(default=3, ge=1)
    #: the sweeper: how often it passes, per-state thresholds in seconds overriding the defaults (by state
    #: name; EXECUTING's default is execution_limit_s plus one sweep interval), the heartbeat ceiling as a
    #: multiple of a state's threshold (1 to 1,000), and how long a decided approval may wait for its Run to
    #: move; every one of these durations is at most 366 days (MAX_DURATION_S)
    sweep_interval_s: Seconds = SWEEP_INTERVAL_S
    state_thresholds: dict[str, float] = Field(default_factory=dict)
    heartbeat_ceiling_factor: float = Field(default=2.0, ge=1.0, le=MAX_CEILING_FACTOR)
    decided_approval_s: Seconds = 30.0
    #: a Run nobody drives is picked up by the embedded worker once it has not moved for this long
    redrive_grace_s: SecondsOrZero = 2.0
    #: the queue of accepted Runs not yet started (CREATED): at `max_backlog` of them (counted in the
    #: database, every replica together) a new Run is refused, told to retry after `backlog_retry_after_s`;
    #: `queue_max_wait_s` is the start deadline of a Run whose request names no `start_by`, in seconds after
    #: its acceptance, at most 366 days (None: it waits as long as it takes; a queued Run is never failed
    #: for waiting)
    max_backlog: int = Field(default=10_000, ge=1)
    backlog_retry_after_s: int = Field(default=5, ge=1, le=3_600)
    queue_max_wait_s: Seconds | None = None
    #: the threads of each kind of call that cannot wait without one, each kind its own lane so that
    #: none starves another: local (in-process) skills, sandboxed skills (each waits for its process),
    #: and model calls of a provider without asynchronous I/O (a local model, a custom provider); the
    #: OpenAI-compatible provider waits without a thread. A call's timeout starts when it starts running.
    #: Runs one process drives at once (`harness serve`'s embedded worker, a Celery worker process): each
    #: waits for its model, skills and child Runs without a thread (HARNESS_WORKER_THREADS, its name
    #: before Runs stopped needing a thread each, is read too)
    drive_concurrency: int = Field(default=1000, ge=1, le=100_000)
    #: the threads those Runs are driven on, each an asyncio loop of its own (HARNESS_DRIVE_THREADS); a
    #: statement to a database server holds its loop's thread for the round trip, and the other loops run
    #: meanwhile. None: 1 on SQLite (no round trip), 4 on PostgreSQL and MySQL
    drive_threads: int | None = Field(default=None, ge=1, le=64)
    #: a drive loop later than this (how late its timers fire) starts no new drive until it catches up:
    #: when the CPU is the limit, Runs wait queued in CREATED instead of all crawling at once
    drive_max_lag_s: Seconds = 0.5
    local_skill_threads: int = Field(default=32, ge=1, le=4_096)
    sandbox_threads: int = Field(default=32, ge=1, le=4_096)
    llm_threads: int = Field(default=32, ge=1, le=4_096)
    #: on PostgreSQL every state change sends a NOTIFY and each process listens, so that a caller waiting
    #: for a Run (`events`, `wait`, the service's SSE) wakes when any process changes it; off: waits poll
    events_push: bool = True

    def drive_loop_threads(self) -> int:
        """The threads a process drives its Runs on (drive_threads, or what suits the database)."""
        if self.drive_threads is not None:
            return self.drive_threads
        scheme = (self.db or "").split(":", 1)[0].split("+", 1)[0]
        return 4 if scheme in ("postgresql", "postgres", "mysql", "mariadb") else 1

    def thresholds(self) -> Thresholds:
        """The sweeper's thresholds these settings describe."""
        try:
            return Thresholds.build(self.state_thresholds, execution_limit_s=self.execution_limit_s,
                                    sweep_interval_s=self.sweep_interval_s,
                                    ceiling_factor=self.heartbeat_ceiling_factor, decided_s=self.decided_approval_s)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid settings: state_thresholds: {exc}") from exc
    #: how large a Run request may be (HARNESS_MAX_* variables, harness.domain.limits)
    limits: RequestLimits = RequestLimits()
    #: approver endpoints, Caller signing secrets and the retry schedule of the pushed events (SPEC P4 /
    #: N1); None: only HARNESS_WEBHOOK_SECRET, if set, signing every tenant's callbacks
    webhooks_file: Path | None = None
    #: signed checkpoints published without a person (SPEC A3b) by `harness serve` and the Celery beat:
    #: every `checkpoint_interval_s` (0: never), into `checkpoint_dir` (None: ./harness-checkpoints/<database
    #: id>), each also given to the witnesses (directories or http(s) URLs)
    checkpoint_interval_s: SecondsOrZero = 300.0
    checkpoint_dir: Path | None = None
    checkpoint_witnesses: tuple[str, ...] = ()
    #: the internal addresses a witness URL may reach (host names, addresses, networks, or "*" for any): like
    #: a callback, a witness may only reach public addresses unless the operator allows it here
    witness_allow_internal: tuple[str, ...] = ()
    #: the Unix socket of a `harness signer serve` process that signs checkpoints (harness.ports.signer), so
    #: this process holds no key; None: this process signs with its key file (harness.audit.keys)
    signer_socket: Path | None = None
    #: MCP servers whose tools are skills (HARNESS_MCP_FILE, harness.skills.mcp); None: no MCP server
    mcp_file: Path | None = None

    @field_validator("witness_allow_internal")
    @classmethod
    def _allow_list(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        OutboundRule.parse(value)  # ValueError naming the entry that is not a host, an address or a network
        return value

    def witness_rule(self) -> OutboundRule:
        """What an HTTP witness may reach: public addresses, and the internal ones `witness_allow_internal`
        names."""
        return OutboundRule.parse(self.witness_allow_internal)

    def check_witnesses(self, specs: Sequence[str] | None = None, resolve: Resolver | None = None) -> None:
        """Refuse an http(s) witness (of `specs`, else the configured ones) whose host is, or resolves to, an
        internal address `witness_allow_internal` does not allow: InvalidRequestError naming the URL and the
        setting. A name that does not resolve yet passes (the witness is then reported unreachable)."""
        guard = OutboundGuard(resolve or system_resolver, remedy=WITNESS_REMEDY)
        rule = self.witness_rule()
        for spec in self.checkpoint_witnesses if specs is None else specs:
            if not spec.startswith(("http://", "https://")):
                continue  # a directory
            host = urllib.parse.urlsplit(spec).hostname
            if not host:
                raise InvalidRequestError(f"checkpoint witness {spec}: the URL names no host")
            try:
                guard.addresses(host, rule)
            except OutboundUnresolvedError:
                continue
            except OutboundRefusedError as exc:
                raise InvalidRequestError(f"checkpoint witness {spec}: {exc}") from None

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from the file HARNESS_CONFIG_FILE names (YAML, keys as the fields here), then
        HARNESS_* environment variables, then explicit overrides."""
        env = os.environ
        values: dict[str, object] = _config_file(env.get("HARNESS_CONFIG_FILE"))
        if env.get("HARNESS_SKILLS_DIRS"):
            values["skills_dirs"] = tuple(Path(p) for p in env["HARNESS_SKILLS_DIRS"].split(os.pathsep) if p)
        if env.get("HARNESS_SKILL_PACKAGES"):
            values["skill_packages"] = tuple(p.strip() for p in env["HARNESS_SKILL_PACKAGES"].split(",") if p.strip())
        for key, name in (("policy_file", "HARNESS_POLICY_FILE"), ("llm_rules", "HARNESS_LLM_RULES"),
                          ("data_dir", "HARNESS_DATA_DIR"), ("llm", "HARNESS_LLM"),
                          ("identities_file", "HARNESS_IDENTITIES"),
                          ("execution_limit_s", "HARNESS_EXECUTION_LIMIT_S"), ("sandbox", "HARNESS_SANDBOX"),
                          ("chain_depth", "HARNESS_CHAIN_DEPTH"), ("max_rounds", "HARNESS_MAX_ROUNDS"),
                          ("tokenizer", "HARNESS_TOKENIZER"), ("memory", "HARNESS_MEMORY"),
                          ("memory_write_scope", "HARNESS_MEMORY_WRITE_SCOPE"),
                          ("memory_recall_window", "HARNESS_MEMORY_RECALL_WINDOW"),
                          ("knowledge", "HARNESS_KNOWLEDGE"), ("knowledge_share", "HARNESS_KNOWLEDGE_SHARE"),
                          ("trace_buffer", "HARNESS_TRACE_BUFFER"),
                          ("webhooks_file", "HARNESS_WEBHOOKS_FILE"), ("agent", "HARNESS_AGENT"),
                          ("mcp_file", "HARNESS_MCP_FILE")):
            if env.get(name):
                values[key] = env[name]
        for key, name in (("checkpoint_interval_s", "HARNESS_CHECKPOINT_INTERVAL_S"),
                          ("checkpoint_dir", "HARNESS_CHECKPOINT_DIR"), ("signer_socket", "HARNESS_SIGNER_SOCKET")):
            if env.get(name):
                values[key] = env[name]
        for key, name in (("checkpoint_witnesses", "HARNESS_CHECKPOINT_WITNESS"),
                          ("witness_allow_internal", WITNESS_ALLOW_INTERNAL_ENV)):
            if env.get(name):
                values[key] = tuple(w.strip() for w in env[name].split(",") if w.strip())
        for key in ("sandbox_host", "sandbox_host_cap", "sandbox_tenant_cap", "sandbox_lease_s",
                    "sandbox_stream_bytes", "artifact_max_bytes", "artifact_max_count", "artifact_store"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
        for key in ("sandbox_provider", "sandbox_url"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
        for key in ("sandbox_remote_tenants", "sandbox_remote_skills"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = tuple(v.strip() for v in env[f"HARNESS_{key.upper()}"].split(",") if v.strip())
        if "HARNESS_SANDBOX_PORTS" in env:
            values["sandbox_ports"] = env["HARNESS_SANDBOX_PORTS"]
        for key in ("llm_model", "llm_fallback_model", "llm_base_url", "llm_api_key_env", "llm_pricing",
                    "llm_stream", "llm_plan_mode", "llm_timeout_s", "llm_plan_format", "llm_tools_in_prompt",
                    "llm_max_tokens", "llm_plan_max_steps", "llm_top_p", "lease_ttl_s", "max_stalls",
                    "sweep_interval_s",
                    "heartbeat_ceiling_factor", "decided_approval_s", "redrive_grace_s", "local_skill_threads",
                    "sandbox_threads", "llm_threads", "drive_concurrency", "drive_threads", "drive_max_lag_s"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
        for key in ("max_backlog", "backlog_retry_after_s", "queue_max_wait_s"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
        if env.get("HARNESS_EVENTS_PUSH"):
            values["events_push"] = env["HARNESS_EVENTS_PUSH"]
        if "drive_concurrency" not in values and env.get("HARNESS_WORKER_THREADS"):
            values["drive_concurrency"] = env["HARNESS_WORKER_THREADS"]
        if env.get("HARNESS_STATE_THRESHOLDS"):
            try:
                values["state_thresholds"] = parse_overrides(env["HARNESS_STATE_THRESHOLDS"])
            except ValueError as exc:
                raise InvalidRequestError(f"invalid settings: HARNESS_STATE_THRESHOLDS: {exc}") from exc
        values["limits"] = RequestLimits.from_env()
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls.model_validate(values)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid settings: {exc}") from exc
        settings.thresholds()  # a bad threshold is named now, not at the first sweep
        settings.check_witnesses()  # and a witness at an address it may not reach
        return settings


#: the environment variable of `witness_allow_internal`
WITNESS_ALLOW_INTERNAL_ENV = "HARNESS_WITNESS_ALLOW_INTERNAL"
#: what a refused witness URL tells the operator to do
WITNESS_REMEDY = ("a checkpoint witness may only reach public addresses unless the operator allows it: add the "
                  f"host, its address or network (or * for any) to {WITNESS_ALLOW_INTERNAL_ENV} "
                  "(witness_allow_internal in the config file)")


def system_resolver(host: str) -> list[str]:
    """The addresses the system resolver gives `host` (OSError when it gives none)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]


def parse_port_range(text: str) -> tuple[int, int] | None:
    """"LOW-HIGH" (inclusive, within 1024-65535) as a pair; "" for no port pool."""
    if not text.strip():
        return None
    low, sep, high = text.strip().partition("-")
    try:
        pair = (int(low), int(high if sep else low))
    except ValueError:
        raise ValueError(f"sandbox_ports must be LOW-HIGH, like 41000-41255, not {text!r}") from None
    if not 1024 <= pair[0] <= pair[1] <= 65535:
        raise ValueError(f"sandbox_ports {text!r}: the range must lie within 1024-65535, low before high")
    return pair


#: how a setting names an agent written in Python, `module:attr` (dotted names on both sides of one colon);
#: anything else names an agent file
AGENT_REFERENCE = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")

#: fields of Settings that are paths: in a config file they are relative to the file's folder
_PATH_FIELDS = ("skills_dirs", "policy_file", "llm_rules", "llm_pricing", "identities_file", "data_dir", "agent",
                "mcp_file")


def _config_file(name: str | None) -> dict[str, object]:
    """The settings a YAML config file holds (HARNESS_CONFIG_FILE); {} when none is named."""
    if not name:
        return {}
    path = Path(name)
    raw = read_yaml(path, InvalidRequestError, "the config file")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{path}: the config file must be a mapping of setting names to values")
    values: dict[str, object] = dict(raw)
    base = path.resolve().parent
    for key in _PATH_FIELDS:
        value = values.get(key)
        if key == "agent" and isinstance(value, str) and AGENT_REFERENCE.match(value.strip()):
            continue  # an importable module's attribute, not a file beside this one
        if isinstance(value, str):
            values[key] = str(base / value)
        elif isinstance(value, list):
            values[key] = [str(base / str(v)) for v in value]
    return values
