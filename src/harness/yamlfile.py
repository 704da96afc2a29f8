"""Loading a YAML file into a Pydantic model, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from harness.domain.errors import BadInputError

M = TypeVar("M", bound=BaseModel)


def parse_yaml(text: str) -> Any:
    """The YAML document `text`, as `yaml.safe_load` reads it, parsed by libyaml when PyYAML has it (the
    pure-Python parser costs a command's start ~30 ms on an agent's manifests, policy and rules). A document
    libyaml refuses is read again by the pure-Python parser: its verdict and its message are the ones users
    have always seen."""
    if yaml.__with_libyaml__:
        try:
            return yaml.load(text, Loader=yaml.CSafeLoader)  # the safe loader, in C
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


def read_text(path: Path, error: type[BadInputError] = BadInputError, what: str = "") -> str:
    """The text of the UTF-8 file at `path` (a config file: YAML, Cedar); `error` naming the file when it
    cannot be read or is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read{' ' + what if what else ''}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_yaml(path: Path, error: type[BadInputError] = BadInputError, what: str = "") -> Any:
    """The parsed YAML file at `path`; `error` naming the file when it cannot be read or parsed."""
    text = read_text(path, error, what)
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from exc


def load_yaml_model(path: str | Path, model: type[M], what: str, error: type[BadInputError] = BadInputError) -> M:
    """`model` validated from the YAML file at `path`; `error` naming the file (and field) otherwise."""
    path = Path(path)
    raw = read_yaml(path, error, what)
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise error(f"{path}: {where}: {err['msg']}") from exc
