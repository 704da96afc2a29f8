"""Typed contracts between the six pipeline components (SPEC P1-P4, seed 004 ch. 3).

Every model forbids unknown fields, so a malformed request fails with a message naming the field instead
of being half-understood. The model's plan for a round is in harness.domain.plans.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.domain import limits
from harness.domain.outbound import is_valid_host

IDENT = r"^[A-Za-z0-9][A-Za-z0-9_.:@\-]{0,127}$"
Ident = Annotated[str, Field(pattern=IDENT)]
SKILL_ID = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"
#: the most levels of child Runs any request may ask for (a deployment's own limit is usually lower)
MAX_CHAIN_DEPTH = 64
#: the levels of child Runs a Run may start when neither its caller nor the deployment says otherwise
DEFAULT_CHAIN_DEPTH = 4
#: the rounds a Run may plan (each round's results shown to the model before the next) by default, and at most
DEFAULT_MAX_ROUNDS = 4
MAX_ROUNDS = 64

MAX_URL = 2_048


def check_callback_url(value: str) -> str:
    """A webhook URL as harness accepts it: http or https, a host, no credentials, no fragment; ValueError
    naming what is wrong otherwise (the caller's text, never a URL with a password, is repeated)."""
    if len(value) > MAX_URL:
        raise ValueError(f"a callback URL has at most {MAX_URL} characters")
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # raises for a port that is not a number or out of range
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"a callback URL must be http or https, not {parts.scheme or 'without a scheme'}")
    if not parts.hostname:
        raise ValueError("a callback URL needs a host")
    if not is_valid_host(parts.hostname):
        raise ValueError(f"not a valid host name: {parts.hostname!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a callback URL must not carry credentials: the payload is signed instead")
    if parts.fragment:
        raise ValueError("a callback URL must not have a #fragment")
    if any(c.isspace() for c in value):
        raise ValueError("a callback URL must not contain whitespace")
    del port
    return value


CallbackUrl = Annotated[str, AfterValidator(check_callback_url)]


def in_utc(value: dt.datetime) -> dt.datetime:
    """An aware time as UTC; ValueError when its offset takes it past the first or the last day a date
    can hold (9999-12-31T23:59:59-05:00 is in the year 10000 in UTC)."""
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"{value.isoformat()} is out of range: in UTC it must fall within the years 1 to "
                         "9999") from None


#: a moment a caller names (ISO 8601 with its offset), kept in UTC
StartBy = Annotated[AwareDatetime, AfterValidator(in_utc)]


class Contract(BaseModel):
    """Base of every contract: strict about unknown fields, immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def nul_in(value: Any, where: str = "") -> str | None:
    """Where in `value` (texts, keys, lists and mappings, nested) a NUL character is; None when nowhere."""
    if isinstance(value, str):
        return (where or "the text") if "\x00" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{where}.{k}" if where else str(k)
            found = path if isinstance(k, str) and "\x00" in k else nul_in(v, path)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = nul_in(item, f"{where}[{i}]")
            if found:
                return found
    return None


def refuse_nul(value: Any) -> Any:
    """`value` unchanged; ValueError naming the field when any text in it holds a NUL character (no
    database stores one in text, and no caller means one)."""
    found = nul_in(value)
    if found:
        where = found.replace("\x00", "\\x00")
        raise ValueError(f"{where}: text must not contain NUL characters")
    return value


class Input(Contract):
    """Base of what a caller submits: no text in it holds a NUL character."""

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        return refuse_nul(value)


class Message(Input):
    """One turn of conversation history."""

    role: Literal["user", "assistant", "system", "tool"]
    content: str = Field(max_length=limits.MESSAGE_CHARS_CEILING)


class CallerIdentity(Input):
    """Who asks: tenant, user and roles. The gatekeeper's principal."""

    tenant_id: Ident
    user_id: Ident
    roles: tuple[Annotated[str, Field(pattern=IDENT)], ...] = ()


class MemoryRequest(Input):
    """How a Run wants long-term memory recalled. Naming a tenant, user, session or team
    other than the caller's own fails the Run; it never narrows to what happens to be visible."""

    enabled: bool = True
    query: str | None = Field(default=None, max_length=2_000)
    k: int | None = Field(default=None, ge=1, le=50)
    tenant_id: Ident | None = None
    user_id: Ident | None = None
    session_id: Ident | None = None
    team_id: Ident | None = None


MetadataKey = Annotated[str, Field(min_length=1, max_length=limits.METADATA_KEY_CHARS)]


class RunRequest(Input):
    """What a caller submits to create a Run (step ①). Sizes are bounded by the ceilings here and by the
    configured limits (harness.domain.limits), checked at submit."""

    task: str = Field(min_length=1, max_length=limits.TASK_CHARS_CEILING)
    tenant_id: Ident = "default"
    user_id: Ident = "anonymous"
    session_id: Ident = "default"
    #: the caller's roles; a request that does not name them gets its identity's roles from the identity
    #: directory at submit, and an identity the directory does not know gets none
    roles: tuple[Annotated[str, Field(pattern=IDENT)], ...] = Field(default=(), max_length=limits.ROLES_CEILING)
    history: tuple[Message, ...] = Field(default=(), max_length=limits.HISTORY_MESSAGES_CEILING)
    token_budget: int = Field(default=8_000, ge=256, le=2_000_000)
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    retry_of: str | None = Field(default=None, max_length=64)
    metadata: dict[MetadataKey, Annotated[str, Field(max_length=limits.METADATA_VALUE_CHARS_CEILING)]] = Field(
        default_factory=dict, max_length=limits.METADATA_ENTRIES_CEILING)
    team_id: Ident | None = None
    memory: MemoryRequest | None = None
    #: the caller's remaining delegation budget (seed 004 §4.1): how many more levels of child Runs
    #: (AgentInvoke) this Run may start. None takes the deployment's default depth; a child gets one
    #: less than its parent; at 0 the gatekeeper refuses any AgentInvoke in the plan.
    chain_remaining: int | None = Field(default=None, ge=0, le=MAX_CHAIN_DEPTH)
    #: where the Run's approval requests and results are pushed, signed (SPEC P4 / N1); None: nowhere
    callback: CallbackUrl | None = None
    #: the latest moment the Run may start (an ISO-8601 time with its offset, kept in UTC): a Run still
    #: waiting in the queue then is closed CLOSED_FAILED `not_started` instead of running late. None: the
    #: deployment's HARNESS_QUEUE_MAX_WAIT_S after acceptance, if set; otherwise it waits as long as it takes
    start_by: StartBy | None = None

    @field_validator("task")
    @classmethod
    def _task_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("task must not be blank")
        return value

    @property
    def caller(self) -> CallerIdentity:
        """The caller's identity."""
        return CallerIdentity(tenant_id=self.tenant_id, user_id=self.user_id, roles=self.roles)


class GivenChunk(Contract):
    """A knowledge-base chunk the model was given: which one, from which document, and the hash of its content
    (what a replay and an auditor compare with the stored chunk)."""

    chunk_id: str
    document_id: str
    kb: str
    source: str
    content_hash: str
    tokens: int
    #: only the first words of it fitted the budget (its `tokens` are what was given)
    trimmed: bool = False


class AssembledContext(Contract):
    """What the plan orchestrator receives from the context assembler (step ②)."""

    system_prompt: str
    history: tuple[Message, ...]
    user_input: str
    memory: tuple[str, ...] = ()
    tokens_used: int
    token_budget: int
    filtered_secrets: int = 0
    #: how the context was built (C1-C4): tokenizer, recalled entry ids, why recall degraded, compression
    tokenizer: str = ""
    memory_ids: tuple[str, ...] = ()
    recall_mode: str = "off"
    recall_degraded: str | None = None
    compression: dict[str, int] = Field(default_factory=dict)
    #: knowledge-base snippets given to the model, best first; how they were searched, why not when they were not
    knowledge: tuple[GivenChunk, ...] = ()
    knowledge_mode: str = "off"
    knowledge_degraded: str | None = None

    @property
    def budget_left(self) -> int:
        """Tokens still available for the model's answer and tool schemas."""
        return self.token_budget - self.tokens_used


class Verdict(Contract):
    """One rule's verdict on a plan or a call (a PolicyTrace)."""

    rule_id: str
    family: Literal["structural", "permission", "budget", "guardrail", "risk"]
    decision: Literal["pass", "reject", "await_hitl"]
    reason: str
    step_id: str | None = None
    level: Literal["L1", "L2", "L3", "L4"] | None = None


class PolicyDecision(Contract):
    """The gatekeeper's unified decision (step ⑤): pass, reject or await_hitl, with every verdict."""

    decision: Literal["pass", "reject", "await_hitl"]
    verdicts: tuple[Verdict, ...]
    level: Literal["L1", "L2", "L3", "L4"] = "L1"

    @property
    def rejecting(self) -> tuple[Verdict, ...]:
        """The verdicts that rejected."""
        return tuple(v for v in self.verdicts if v.decision == "reject")


class ArtifactFile(Contract):
    """A file a sandboxed skill wrote in its Run's working directory, kept by content hash: its path in
    the directory, size, media type, the SHA-256 of its bytes (what a download is checked against) and
    the hash its stored content is filed under."""

    step_id: str
    name: str
    size: int
    media_type: str
    sha256: str
    content_hash: str
    #: whether secrets were removed from it (a text file) before it was stored: its bytes, size and SHA-256
    #: are then those of the filtered file
    filtered: bool = False


class SkippedFile(Contract):
    """A file a sandboxed skill wrote that was not kept, and why (over the size or count bound, not a
    plain file of the directory, not filterable)."""

    step_id: str
    name: str
    size: int
    reason: str


class StepOutcome(Contract):
    """The recorded result of one executed plan step (recorded before the next step starts); a sandboxed
    call's also holds what it printed (bounded and filtered for secrets) and the files it wrote."""

    step_id: str
    output_key: str
    status: Literal["ok", "error"]
    output: Any = None
    error: str | None = None
    attempts: int = 1
    duration_ms: float = 0.0
    stdout: str | None = None
    stderr: str | None = None
    files: tuple[ArtifactFile, ...] = ()
    skipped_files: tuple[SkippedFile, ...] = ()

    def recorded(self) -> dict[str, Any]:
        """This outcome as the RunContext keeps it: JSON, without the streams and file lists of a call that
        has none (a local call's outcome reads as it always did)."""
        doc = self.model_dump(mode="json")
        for key in ("stdout", "stderr", "files", "skipped_files"):
            if not doc[key]:
                del doc[key]
        return doc


class RunResult(Contract):
    """What the ResultSink delivers to the caller: answer, artifacts, trace id, final state."""

    #: the Run's id
    run_id: str
    #: its state now, one of the 15 (`RunState` values)
    state: str
    #: the answer, once the Run succeeded
    answer: str | None = None
    #: the steps' results by their output key
    artifacts: dict[str, Any] = Field(default_factory=dict)
    #: the files the Run's sandboxed skills wrote, kept by content hash (download them from the API's
    #: /api/v1/runs/{run_id}/files/{sha256}, or the Run's console page)
    files: tuple[ArtifactFile, ...] = ()
    #: the id its trace records are filed under (the Run's id)
    trace_id: str
    #: why it failed or was rejected, when it did
    error: str | None = None
    #: the request it waits on, while AWAITING_HITL
    approval_request_id: str | None = None
    #: every state it passed, in order
    path: tuple[str, ...] = ()
    #: for a cancelled Run, the calls with side effects that had started before the cancel took effect,
    #: each with its step, skill and status: "completed", "failed", or "in_flight" (it was running when
    #: the Run was cancelled and is let finish; nothing starts after the cancel)
    effects: tuple[dict[str, str], ...] = ()


#: how a call with side effects stands, by the status of its step in the RunContext
_EFFECT_STATUS = {"ok": "completed", "error": "failed", "started": "in_flight"}


def effects_of(context: dict[str, Any] | None) -> tuple[dict[str, str], ...]:
    """The calls with side effects a Run started (the RunContext's `effects`, each marked in the database
    before its call, while the Run was EXECUTING), with their step, skill and status now."""
    context = context or {}
    steps = context.get("steps") or {}
    return tuple({"step_id": str(e.get("step_id")), "skill": str(e.get("skill")),
                  "status": _EFFECT_STATUS.get(str((steps.get(e.get("step_id")) or {}).get("status")), "in_flight")}
                 for e in context.get("effects") or ())


NotificationType = Literal[
    "approval.requested", "approval.escalated", "approval.decided", "approval.timed_out", "approval.cancelled",
    "run.awaiting_approval", "run.finished",
]


class Notification(Contract):
    """An event to push (SPEC P4 / N1; seed 004 §4.1 ⑩ and ⑱): to the Run's callback, if it has one, and
    to the endpoints of the tenant's approvers holding one of `approver_roles`. `event_id` is stable:
    every delivery and every retry of this event carries it, so receivers can deduplicate."""

    event_id: str
    type: NotificationType
    tenant_id: str
    run_id: str | None
    callback: str | None = None
    approver_roles: tuple[str, ...] = ()
    data: dict[str, Any]
