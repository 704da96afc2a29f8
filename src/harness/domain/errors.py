"""The exception tree. Every error the library raises derives from HarnessError.

    HarnessError
    ├── BadInputError                 the caller's input is wrong (CLI exit 2, HTTP 4xx)
    │   ├── InvalidRequestError       a malformed RunRequest or argument
    │   │   └── RequestTooLargeError  a request over its size limit (HTTP 413)
    │   ├── IdempotencyConflictError  an idempotency key reused with another request (HTTP 409)
    │   ├── UnknownRunError           no Run with that id
    │   ├── UnknownDocumentError      no knowledge-base document with that id in the caller's tenant
    │   ├── DocumentError             a file that cannot be ingested (unreadable, empty, of an unknown kind)
    │   ├── ManifestError             a skill manifest that cannot be loaded
    │   └── PolicyConfigError         a policy file that cannot be loaded
    ├── BacklogFullError              too many accepted Runs wait to start; retry later (HTTP 429)
    ├── ForbiddenError                the caller may not do this; nothing was changed (CLI exit 1, HTTP 403)
    ├── InvalidTransitionError        (from, to) is not in the transition table
    ├── ConflictError                 the Run moved on first; the request changed nothing (HTTP 409)
    │   ├── CancelRefusedError        a cancel lost to the close it raced (names the state)
    │   ├── SkillsUnavailableError    this process lacks skills a parked Run's approved steps call
    │   └── SkillsElsewhereError      this process lacks skills a Run's plan calls: left to one that has them
    ├── StoreError                    the database failed or holds something it should not
    │   ├── FencedError               this worker's lease on the Run was taken over (K5b)
    │   └── DatabaseUnavailableError  the database stayed unreachable through the retries; try later
    ├── ProviderError                 an LLM provider call failed (retryable or not, SPEC T3)
    └── PipelineError                 a pipeline step failed; carries the state it leads to
        ├── PlanError                 the model's plan is invalid
        ├── ContextError              the context could not be assembled (budget, isolation, filter)
        ├── BudgetExceededError       a model call's worst case does not fit what a budget cap has left
        └── SkillError                a skill failed

Signals that are not errors (approval needed) live with the gatekeeper, apart from this tree.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Root of every error harness-kernel raises."""


class BadInputError(HarnessError):
    """Input from a caller, a file or a model is wrong; the message names the problem."""


class InvalidRequestError(BadInputError):
    """A malformed request or argument."""


class RequestTooLargeError(InvalidRequestError):
    """The request as a whole is larger than its limit."""


class IdempotencyConflictError(BadInputError):
    """The caller reused an idempotency key with a request other than the one it first came with."""

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class UnknownRunError(BadInputError):
    """No Run has this id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}")
        self.run_id = run_id


class UnknownDocumentError(BadInputError):
    """No knowledge-base document has this id in the caller's tenant (another tenant's looks the same)."""

    def __init__(self, document_id: str, tenant_id: str) -> None:
        super().__init__(f"no knowledge-base document {document_id!r} in tenant {tenant_id!r}")
        self.document_id = document_id


class DocumentError(BadInputError):
    """A file cannot be ingested into a knowledge base: unreadable, empty, or of a kind not read."""


class ManifestError(BadInputError):
    """A skill manifest is broken; the message names the file and field."""


class PolicyConfigError(BadInputError):
    """A policy file is broken; the message names the file and field."""


class BacklogFullError(HarnessError):
    """A new Run was refused, nothing written: `backlog` accepted Runs are waiting to start (state CREATED,
    counted in the database, so across replicas) and the deployment takes at most `bound`
    (HARNESS_MAX_BACKLOG). Accepting it would only have it wait past what the workers can start; the caller
    should retry after `retry_after_s` seconds."""

    def __init__(self, backlog: int, bound: int, retry_after_s: int) -> None:
        super().__init__(f"the queue is full: {backlog} accepted Runs are waiting to start and this deployment "
                         f"takes at most {bound} (HARNESS_MAX_BACKLOG); retry after {retry_after_s} s")
        self.backlog = backlog
        self.bound = bound
        self.retry_after_s = retry_after_s


class ForbiddenError(HarnessError):
    """The caller is who they say but may not do this (the Run is another user's, a role is missing);
    nothing was changed."""


class InvalidTransitionError(HarnessError):
    """The requested (from, to) pair is not in the transition table (SPEC K2)."""

    def __init__(self, run_id: str, source: str, target: str) -> None:
        super().__init__(f"illegal transition {source} -> {target} for run {run_id}")
        self.run_id = run_id
        self.source = source
        self.target = target


class ConflictError(HarnessError):
    """The request raced another change to the same Run and lost; nothing was changed by it."""


class CancelRefusedError(ConflictError):
    """A cancel found the Run already closing or closed: it took no effect. `state` is where it is."""

    def __init__(self, run_id: str, state: str) -> None:
        super().__init__(f"run {run_id} is already {state}; the cancel took no effect")
        self.run_id = run_id
        self.state = state


class SkillsUnavailableError(ConflictError):
    """An approval refused before it was recorded: this process would drive the approved Run but lacks skills
    its approved steps call (`missing`), or has other versions of them than the Run pinned at its start
    (`changed`): another agent, or changed code. The Run stays parked; a process with the Run's agent (or a
    decision that leaves the drive to one) can take the approval."""

    def __init__(self, run_id: str, missing: list[str], changed: list[str]) -> None:
        parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
            [f"changed since the Run started: {', '.join(changed)}"] if changed else [])
        super().__init__(f"approval refused, nothing recorded: run {run_id}'s approved steps call skills this "
                         f"process does not have as the Run pinned them ({'; '.join(parts)}); the Run stays "
                         "AWAITING_HITL. Approve it where its agent runs (HARNESS_AGENT or --agent module:attr), "
                         "or record the approval without driving it here (harness approve --no-resume) for a "
                         "worker that runs that agent")
        self.run_id = run_id
        self.missing = missing
        self.changed = changed


class SkillsElsewhereError(ConflictError):
    """A drive that stopped before its Run's next step, changing nothing: this process has none of some
    skills the Run's plan calls (it runs another agent). The Run stays where it is, for a process that
    runs its agent; the sweeper closes it if none ever does."""

    def __init__(self, run_id: str, missing: list[str]) -> None:
        super().__init__(f"run {run_id} was not driven here: its plan calls skills this process does not have "
                         f"({', '.join(missing)}); it is left for a process that runs its agent "
                         "(HARNESS_AGENT or --agent module:attr)")
        self.run_id = run_id
        self.missing = missing


class StoreError(HarnessError):
    """The store failed, or holds data that breaks an invariant."""


class FencedError(StoreError):
    """This worker no longer holds the Run's lease; it must make no further write or side effect."""


class DatabaseUnavailableError(StoreError):
    """The database could not be reached, or dropped the connection, on every try: nothing the caller
    asked for can be taken as done; the same request (with its idempotency key) may be sent again."""


class PipelineError(HarnessError):
    """A pipeline step failed in a way the Run manager maps to an explicit state."""

    code = "pipeline_error"


class PlanError(PipelineError):
    """The plan from the model is not valid; `response` keeps the model's answer (its cost counts)."""

    code = "invalid_plan"
    response: object | None = None


class ContextError(PipelineError):
    """The context could not be assembled."""

    code = "context_error"


class BudgetExceededError(PipelineError):
    """A model call was not made: its worst case (its prompt and max_tokens of output at the model's price)
    does not fit what a budget cap has left."""

    code = "budget_exceeded"


class SkillError(PipelineError):
    """A skill call failed."""

    code = "skill_failed"


class ProviderError(HarnessError):
    """An LLM provider call failed. `retryable` follows SPEC T3: network, 5xx and 429 are retried;
    4xx, auth, billing and context-length errors fail at once."""

    def __init__(self, message: str, *, kind: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after
