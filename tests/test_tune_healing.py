"""The local driver heals: a killed stub is reloaded by the control loop itself, and said so.

tests/test_healing.py proves the Healer alone; this proves the drivers wire it in
(`reconcile(..., healer=...)`, which the kopf driver and `tritonscale tune` both call).
"""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.faults import add_sub_once, kill_stub, stub_pids
from tests.tooling import require_local_triton
from tritonscale.drivers.tune import Tuner, parse_config
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.healing import HEALED, HEALTHY, RELOADED


async def test_the_local_driver_reloads_a_model_whose_stub_died_and_reports_it() -> None:
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"]) as server:
        config = parse_config(
            {
                "triton": {"http": [server.http_url], "metrics": [server.metrics_url]},
                "metrics": {"source": "scrape"},
                "policies": [
                    {"name": "add-sub", "spec": {"model": "add_sub", "metricsWindowSeconds": 2}}
                ],
            }
        )
        log, printed = io.StringIO(), []
        tuner = Tuner(
            config, actuator=Actuator(server.repository_key), decision_log=log, echo=printed.append
        )
        policy = config.policies[0]
        healthy = await tuner.tick(policy, time.time())
        condition = next(c for c in healthy.conditions if c["type"] == "ModelHealthy")
        assert (condition["status"], condition["reason"]) == ("True", HEALTHY)
        assert healthy.healing_actions == []

        killed = kill_stub(server, "add_sub")
        rng = np.random.default_rng(0)
        with httpclient.InferenceServerClient(server.http_url) as client:
            for _ in range(3):  # what users see meanwhile: errors, never wrong answers
                with pytest.raises(InferenceServerException, match="not healthy"):
                    add_sub_once(client, rng)

            healed = await tuner.tick(policy, time.time())
            assert [r.action for r in healed.healing_actions] == [RELOADED]
            condition = next(c for c in healed.conditions if c["type"] == "ModelHealthy")
            assert (condition["status"], condition["reason"]) == ("True", HEALED)
            assert killed not in stub_pids(server, "add_sub")
            for _ in range(5):
                add_sub_once(client, rng)

        record = json.loads(log.getvalue().splitlines()[-1])
        assert record["healing"][0]["action"] == RELOADED
        assert any("add_sub" in line and "reload" in line.lower() for line in printed)
        assert server.repository_key not in log.getvalue() + "\n".join(printed)
