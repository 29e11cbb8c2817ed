"""A real Triton serving copies of the test-only model tests/contention_models/shared_lock,
and closed-loop load on them. Used by the NoGain and budget tests.

`contention_repository(path, {"locked": True, "free": False})` writes a model repository
whose models hold each request 20 ms, one request per instance at a time (no batching);
`locked` ones take one fair lock (first come, first served) around the hold, so their instances run one at a time.
`contention_triton(path, models)` serves such a repository (a context manager).
`ClosedLoop(server, {"free": 6})` keeps that many requests in flight per model until it exits.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.tooling import require_local_triton
from tritonscale.local.triton_server import LocalTriton

SOURCE = Path(__file__).resolve().parent / "contention_models" / "shared_lock"


def contention_repository(path: Path, models: Mapping[str, bool]) -> Path:
    """One copy of shared_lock per name, locked or not; returns `path`."""
    for name, locked in models.items():
        shutil.copytree(SOURCE, path / name)
        config = path / name / "config.pbtxt"
        text = config.read_text().replace('name: "shared_lock"', f'name: "{name}"')
        text = text.replace(
            'key: "shared_lock" value: { string_value: "false" }',
            f'key: "shared_lock" value: {{ string_value: "{str(locked).lower()}" }}',
        )
        config.write_text(text)
    return path


@contextmanager
def contention_triton(path: Path, models: Mapping[str, bool]) -> Iterator[LocalTriton]:
    """A Triton on free ports serving `contention_repository(path, models)`."""
    require_local_triton()
    repository = contention_repository(path, models)
    with LocalTriton(
        repository, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=5
    ) as server:
        yield server


class ClosedLoop:
    """Clients per model, each sending its next request when the last one returned."""

    def __init__(self, server: LocalTriton, in_flight: Mapping[str, int]) -> None:
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(server.http_url, model), daemon=True)
            for model, count in in_flight.items()
            for _ in range(count)
        ]

    def _client(self, url: str, model: str) -> None:
        value = httpclient.InferInput("IN", [1], "FP32")
        value.set_data_from_numpy(np.ones(1, dtype=np.float32))
        with httpclient.InferenceServerClient(url, network_timeout=30) as client:
            while not self._stop.is_set():
                try:
                    client.infer(model, [value])
                except Exception as error:  # noqa: BLE001 - reported by the test
                    self.errors.append(f"{model}: {error}")
                    self._stop.wait(0.5)

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=35)
        hung = [thread.name for thread in self._threads if thread.is_alive()]
        assert not hung, f"load clients hung: {hung}"
