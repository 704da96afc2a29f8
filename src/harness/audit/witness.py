"""Checkpoint witnesses: a second place that keeps every checkpoint, append-only (SPEC A3b).

A witness is a directory (`DirectoryWitness`, e.g. another disk or a mounted WORM share) or an HTTP
endpoint (`HttpWitness`, served by `harness witness serve`). Both keep, per database, the checkpoints
they were given in a `WitnessLog`: a checkpoint is accepted only when it is signed by the key the
witness trusts for that database (the first key it saw, then whichever key that one endorsed: a key
rotation) and its tree extends the witness's newest one (an RFC 9162 consistency proof, checked by the
witness itself); anything else is refused. So a local attacker who rewrites the chain, deletes the
local checkpoints and even re-signs cannot make the witness's copies agree, and `harness audit verify
--witness` checks the database against them.

Configured with HARNESS_CHECKPOINT_WITNESS (comma-separated directories and http(s) URLs) or
`--witness`. An HTTP witness may require HARNESS_WITNESS_TOKEN as a bearer token for submissions. A witness
URL at a loopback, private, link-local or otherwise internal address is refused where it is configured
(`Settings.check_witnesses`) unless HARNESS_WITNESS_ALLOW_INTERNAL allows it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit import merkle
from harness.audit.files import json_dumps, json_load, write_new
from harness.audit.formats import (
    CHECKPOINT_FORMAT_V2,
    PUBLIC_KEY_FILE,
    FormatError,
    check_checkpoint,
    database_of,
    hex_proof,
    key_for,
    key_id_of,
    load_public_key,
    signature_problem,
)
from harness.audit.keys import CheckpointError
from harness.audit.places import TOKEN_ENV, WITNESS_ENV
from harness.domain.outbound import OutboundGuard, OutboundRefusedError, OutboundRule, OutboundUnresolvedError, pinned
from harness.settings import WITNESS_ALLOW_INTERNAL_ENV, WITNESS_REMEDY, system_resolver

if TYPE_CHECKING:
    import httpx

_DATABASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NAME = re.compile(r"^checkpoint-(\d{8})\.json$")


class WitnessError(CheckpointError):
    """A witness could not be reached or read; the message names it."""


class WitnessRefusedError(WitnessError):
    """A witness refused a checkpoint: `status` 409 (stale or inconsistent with what it holds), 403 (not
    signed by the key it trusts), 422 (malformed, or of another database)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Receipt:
    """A witness's answer to a submission: the serial it keeps the checkpoint under, and whether it held
    that tree head already."""

    serial: int
    duplicate: bool = False


class Witness(Protocol):
    """Where checkpoints are kept a second time."""

    name: str

    def checkpoints(self, database_id: str) -> list[dict[str, Any]]:
        """Every checkpoint kept for the database, oldest first."""
        ...

    def latest(self, database_id: str) -> dict[str, Any] | None:
        """The newest checkpoint kept for the database."""
        ...

    def public_key(self, database_id: str) -> Ed25519PublicKey | None:
        """The first key the witness trusted for the database (what it pins)."""
        ...

    def submit(self, database_id: str, checkpoint: dict[str, Any], public_key_pem: str | None,
               consistency: dict[str, Any] | None) -> Receipt:
        """Offer a checkpoint, with a consistency proof from the witness's newest tree size."""
        ...


def _pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class WitnessLog:
    """The witness's own storage: per database a folder of numbered, read-only checkpoint files, the
    pinned first key (public-key.pem) and every key it has trusted since (public-keys/<id>.pem)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, database_id: str) -> Path:
        """The database's folder; refuses an id that could name another path."""
        if not _DATABASE_ID.match(database_id):
            raise WitnessRefusedError(422, f"{database_id!r} is not a database id")
        return self.root / database_id

    def _files(self, database_id: str) -> list[Path]:
        folder = self.folder(database_id)
        return sorted(p for p in folder.glob("checkpoint-*.json") if _NAME.match(p.name)) if folder.is_dir() else []

    def checkpoints(self, database_id: str) -> list[dict[str, Any]]:
        """Every checkpoint kept for the database, oldest first."""
        return [json_load(p) for p in self._files(database_id)]

    def latest(self, database_id: str) -> dict[str, Any] | None:
        """The newest checkpoint kept for the database."""
        names = self._files(database_id)
        return json_load(names[-1]) if names else None

    def public_key(self, database_id: str) -> Ed25519PublicKey | None:
        """The key pinned when the database's first checkpoint arrived."""
        path = self.folder(database_id) / PUBLIC_KEY_FILE
        return load_public_key(path.read_bytes()) if path.exists() else None

    def _key(self, database_id: str, key_id: str) -> Ed25519PublicKey:
        return load_public_key((self.folder(database_id) / "public-keys" / f"{key_id}.pem").read_bytes())

    @contextlib.contextmanager
    def _locked(self, database_id: str) -> Iterator[Path]:
        """One submission at a time per database, across processes (the check and the append together)."""
        folder = self.folder(database_id)
        (folder / "public-keys").mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield folder
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def submit(self, database_id: str, checkpoint: dict[str, Any], public_key_pem: str | None,
               consistency: dict[str, Any] | None) -> Receipt:
        """Keep the checkpoint if it is signed by the trusted key and extends the newest one."""
        try:
            doc = check_checkpoint(checkpoint)
        except FormatError as exc:
            raise WitnessRefusedError(422, f"malformed checkpoint: {exc}") from None
        if doc["format"] != CHECKPOINT_FORMAT_V2 or database_of(doc) != database_id:
            raise WitnessRefusedError(422, f"a checkpoint of database {database_of(doc)}, not {database_id} "
                                      f"(a witness keeps checkpoints of format {CHECKPOINT_FORMAT_V2!r})")
        with self._locked(database_id) as folder:
            latest = self.latest(database_id)
            key = self._trusted_signer(database_id, doc, latest, public_key_pem)
            if latest is not None:
                duplicate = self._extends(latest, doc, consistency)
                if duplicate:
                    return Receipt(len(self._files(database_id)), duplicate=True)
            if not (folder / PUBLIC_KEY_FILE).exists():
                write_new(folder / PUBLIC_KEY_FILE, _pem(key))
            key_file = folder / "public-keys" / f"{key_id_of(key)}.pem"
            if not key_file.exists():
                write_new(key_file, _pem(key))
            serial = len(self._files(database_id)) + 1
            write_new(folder / f"checkpoint-{serial:08d}.json", (json_dumps(doc) + "\n").encode("utf-8"))
            return Receipt(serial)

    def _trusted_signer(self, database_id: str, doc: dict[str, Any], latest: dict[str, Any] | None,
                        public_key_pem: str | None) -> Ed25519PublicKey:
        """The key that validly signed `doc`: the key of the newest kept checkpoint or one it endorsed on
        `doc`; for a database's first checkpoint, the key offered with it (trust on first use)."""
        if latest is None:
            if not public_key_pem:
                raise WitnessRefusedError(422, "the first checkpoint of a database must come with its public key")
            try:
                trusted = [load_public_key(public_key_pem.encode("utf-8"))]
            except FormatError as exc:
                raise WitnessRefusedError(422, f"public_key: {exc}") from None
        else:
            trusted = [self._key(database_id, str(latest["key_id"]))]
        key, problem = key_for(doc, trusted)
        problem = problem if key is None else signature_problem(doc, key) or ""
        if key is None or problem:
            raise WitnessRefusedError(403, problem)
        return key

    @staticmethod
    def _extends(latest: dict[str, Any], doc: dict[str, Any], consistency: dict[str, Any] | None) -> bool:
        """True when `doc` is the newest tree head again (nothing to keep); raises unless it extends it."""
        old_size, new_size = int(latest["tree_size"]), int(doc["tree_size"])
        if new_size < old_size:
            raise WitnessRefusedError(409, f"stale: the witness already holds a checkpoint of {old_size} records")
        if new_size == old_size:
            if doc["root_hash"] != latest["root_hash"]:
                raise WitnessRefusedError(409, f"inconsistent: another tree head of {old_size} records than the one "
                                          "the witness holds (the history forked or was rewritten)")
            return True
        given = consistency or {}
        if (given.get("tree_size"), given.get("root_hash")) != (old_size, latest["root_hash"]):
            raise WitnessRefusedError(409, f"stale: give a consistency proof from the witness's newest checkpoint "
                                      f"({old_size} records, root {latest['root_hash']})")
        try:
            proof = hex_proof(given.get("proof"), "consistency.proof")
        except FormatError as exc:
            raise WitnessRefusedError(422, str(exc)) from None
        roots = bytes.fromhex(latest["root_hash"]), bytes.fromhex(doc["root_hash"])
        if not merkle.verify_consistency(old_size, new_size, *roots, proof):
            raise WitnessRefusedError(409, f"inconsistent: the tree of {new_size} records does not extend the "
                                           f"witnessed one of {old_size} (the history was rewritten)")
        return False


class DirectoryWitness:
    """A witness that is a folder (its own WitnessLog), e.g. on another disk or a WORM mount."""

    def __init__(self, root: Path) -> None:
        self.name = str(root)
        self.log = WitnessLog(root)

    def checkpoints(self, database_id: str) -> list[dict[str, Any]]:
        """Every checkpoint kept for the database; a witness folder that is missing or not a folder cannot be
        read (WitnessError): to the auditor a mistyped path, not a witness that holds nothing (the first
        publication to a witness creates its folder)."""
        root = self.log.root
        if not root.is_dir():
            raise WitnessError(f"witness {self.name} " + ("is not a folder" if root.exists() else "does not exist"))
        try:
            return self.log.checkpoints(database_id)
        except CheckpointError as exc:
            raise WitnessError(f"witness {self.name}: {exc}") from None

    def latest(self, database_id: str) -> dict[str, Any] | None:
        return self.log.latest(database_id)

    def public_key(self, database_id: str) -> Ed25519PublicKey | None:
        return self.log.public_key(database_id)

    def submit(self, database_id: str, checkpoint: dict[str, Any], public_key_pem: str | None,
               consistency: dict[str, Any] | None) -> Receipt:
        return self.log.submit(database_id, checkpoint, public_key_pem, consistency)


class HttpWitness:
    """A client of a witness served over HTTP (`harness witness serve`, harness.audit.witness_server).

    Every request goes to an address the witness's host resolves to at that moment and `rule` allows (the
    outbound rule of callbacks: public addresses only, unless the operator allows internal ones), and is
    sent to that address with the URL's own name as Host and TLS server name: a name that resolves to an
    allowed address when checked and to an internal one when connected (DNS rebinding) is refused."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 10.0,
                 transport: httpx.BaseTransport | None = None, rule: OutboundRule | None = None,
                 guard: OutboundGuard | None = None) -> None:
        """`rule` defaults to what HARNESS_WITNESS_ALLOW_INTERNAL allows (public addresses only when unset)."""
        self.name = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.rule = rule if rule is not None else witness_rule()
        self.guard = guard or OutboundGuard(system_resolver, remedy=WITNESS_REMEDY)
        import httpx  # loaded by the processes that talk to an HTTP witness only

        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False, transport=transport)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """`method` `path` on the witness, at an address its rule allows; WitnessError when there is none or
        the witness cannot be reached."""
        import httpx

        host = urllib.parse.urlsplit(self.name).hostname or ""
        try:
            address = self.guard.addresses(host, self.rule)[0]
        except OutboundRefusedError as exc:
            raise WitnessError(f"witness {self.name} not contacted: {exc}") from None
        except OutboundUnresolvedError:
            raise WitnessError(f"witness {self.name} is unreachable: its host {host!r} does not resolve") from None
        url, headers, extensions = pinned(self.name + path, address)
        try:
            return self._client.request(method, url, json=body, headers={**self._headers, **headers},
                                        extensions=extensions)
        except httpx.HTTPError as exc:
            raise WitnessError(f"witness {self.name} is unreachable: {exc}") from None

    def _get(self, path: str) -> httpx.Response | None:
        response = self._request("GET", path)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise WitnessError(f"witness {self.name} answered {response.status_code} to GET {path}")
        return response

    def checkpoints(self, database_id: str) -> list[dict[str, Any]]:
        response = self._get(f"/v1/{database_id}/checkpoints")
        if response is None:
            return []
        try:
            return list(response.json()["checkpoints"])
        except (ValueError, KeyError, TypeError):
            raise WitnessError(f"witness {self.name} answered a list of checkpoints that is not one") from None

    def latest(self, database_id: str) -> dict[str, Any] | None:
        response = self._get(f"/v1/{database_id}/checkpoints/latest")
        return dict(response.json()) if response is not None else None

    def public_key(self, database_id: str) -> Ed25519PublicKey | None:
        response = self._get(f"/v1/{database_id}/public-key")
        return load_public_key(response.content) if response is not None else None

    def submit(self, database_id: str, checkpoint: dict[str, Any], public_key_pem: str | None,
               consistency: dict[str, Any] | None) -> Receipt:
        body = {"checkpoint": checkpoint, "public_key": public_key_pem, "consistency": consistency}
        response = self._request("POST", f"/v1/{database_id}/checkpoints", body)
        if response.status_code in (200, 201):
            answer = response.json()
            return Receipt(int(answer["serial"]), bool(answer.get("duplicate")))
        try:
            message = str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        if response.status_code in (403, 409, 422):
            raise WitnessRefusedError(response.status_code, f"witness {self.name} refused the checkpoint: {message}")
        raise WitnessError(f"witness {self.name} answered {response.status_code}: {message}")

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()


def witness_rule(allow: Sequence[str] | None = None) -> OutboundRule:
    """What an HTTP witness may reach: public addresses, and the internal ones `allow` names (default: those
    HARNESS_WITNESS_ALLOW_INTERNAL names, comma-separated)."""
    if allow is None:
        allow = [a.strip() for a in os.environ.get(WITNESS_ALLOW_INTERNAL_ENV, "").split(",") if a.strip()]
    return OutboundRule.parse(allow)


def open_witness(spec: str, rule: OutboundRule | None = None) -> Witness:
    """The witness a setting names: an http(s) URL (reaching what `rule` allows), else a directory."""
    if spec.startswith(("http://", "https://")):
        return HttpWitness(spec, rule=rule)
    return DirectoryWitness(Path(spec).expanduser())


def configured_witnesses(options: Sequence[str] | None = None,
                         rule: OutboundRule | None = None) -> list[Witness]:
    """The witnesses given as options, else those HARNESS_CHECKPOINT_WITNESS names (comma-separated)."""
    specs = list(options or []) or [s.strip() for s in os.environ.get(WITNESS_ENV, "").split(",")]
    return [open_witness(s, rule) for s in specs if s]


def verified_docs(witness: Witness, database_id: str) -> list[dict[str, Any]]:
    """The witness's checkpoints of the database, each of a valid shape (a malformed one: WitnessError)."""
    docs = witness.checkpoints(database_id)
    for i, doc in enumerate(docs):
        try:
            check_checkpoint(doc)
        except FormatError as exc:
            raise WitnessError(f"witness {witness.name}: checkpoint #{i + 1} is malformed: {exc}") from None
    return docs
