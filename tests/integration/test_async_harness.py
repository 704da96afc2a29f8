"""AsyncHarness is asynchronous all the way down: Runs awaited at once are driven on the caller's own
event loop and wait for their model there, holding no thread each.

50 Runs of the support example gathered against a slow OpenAI-compatible model on loopback: their model
calls are in flight together, and the process's thread count barely moves while they wait.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from harness import AsyncHarness
from harness.drive.leased import Heartbeats
from harness.settings import Settings
from tests.fakes.slow_model import SlowModel, price_file

#: far more than every thread the process may add (a handful, plus the renewers' pool of 8): a thread per
#: awaited call could not keep 45 of them in flight (the model lane has two threads), nor add under 13 threads
RUNS = 50


def test_gathered_runs_wait_for_their_model_together_without_a_thread_each(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """50 gathered AsyncHarness.run calls keep about 50 model calls in flight at once, all succeed, and
    the threads of the process grow by no more than a handful (no thread per awaited call)."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("TEST_KEY", "sk-test")
    prices = price_file(tmp_path)
    with SlowModel(delay_s=1.0) as model:
        settings = Settings(db=backend_url, data_dir=tmp_path / "data", llm="openai", llm_model="gpt-test",
                            llm_base_url=model.url, llm_api_key_env="TEST_KEY", llm_pricing=prices,
                            local_skill_threads=2, llm_threads=2, sandbox_threads=2, memory="off",
                            # no lease renewal falls due meanwhile: each is made on a short thread of its
                            # own (leased_drive.Heartbeats), which a loaded machine would count here
                            lease_ttl_s=600)

        async def main() -> tuple[list[str], int, int]:
            async with AsyncHarness(settings=settings) as h:
                warm = await h.run("Where is order A-1001? (warm-up)", user="alice")
                assert warm.state == "SUCCEEDED", warm
                before = peak = threading.active_count()
                done = asyncio.Event()

                async def sample() -> None:
                    nonlocal peak
                    while not done.is_set():
                        peak = max(peak, threading.active_count())
                        await asyncio.sleep(0.05)

                sampler = asyncio.ensure_future(sample())
                results = await asyncio.gather(*(h.run(f"Where is order A-1001? ({i})", user="alice")
                                                 for i in range(RUNS)))
                done.set()
                await sampler
                return [r.state for r in results], before, peak

        states, before, peak = asyncio.run(main())
    assert states == ["SUCCEEDED"] * RUNS, {s: states.count(s) for s in set(states)}
    assert model.calls == 2 * RUNS + 2
    assert model.peak_in_flight >= 0.9 * RUNS, model.peak_in_flight
    # a few threads, plus the lease renewers' fixed pool: marking "waits outside the process" in the Runs'
    # rows is made there (a bound of its own, whatever the number of Runs)
    assert peak - before <= 5 + Heartbeats.RENEWERS, (before, peak)
