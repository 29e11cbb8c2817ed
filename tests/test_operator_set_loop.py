"""A pod set's loop moves between its members' daemons as the set changes (kopf against kmock;
tritonscale.drivers.set_loop).

Every autoscaler has one kopf daemon; the set's leader (its first member by name) runs the
set. The others sleep until the namespace's sets change: a member that joins under a smaller
name takes the set over, and when the leader is deleted the next member carries on.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator_harness import (
    IGA,
    NAMESPACE,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    delete_object,
    eventually,
    eventually_async,
    patch_object,
    register_resources,
    running_operator,
    status_of,
    ticks,
)

pytestmark = [pytest.mark.unit]


# Another Deployment's pods: the same keys as TRITON_LABELS, so that a merge patch of
# TRITON_LABELS turns the selector into theirs.
ELSEWHERE = {**TRITON_LABELS, "app.kubernetes.io/name": "elsewhere"}


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


def spec(labels: dict[str, str]) -> dict[str, Any]:
    return {"selector": {"matchLabels": labels}, "model": "add_sub", "intervalSeconds": 1}


@pytest.mark.kmock(cls=Emulator)
async def test_a_member_joining_under_a_smaller_name_leads_and_the_next_one_follows_a_deletion(
    api: Emulator,
) -> None:
    api.objects[IGA, NAMESPACE, "b-member"] = autoscaler("b-member", spec(TRITON_LABELS))
    api.objects[IGA, NAMESPACE, "a-member"] = autoscaler("a-member", spec(ELSEWHERE))

    def pod_set(name: str) -> list[str] | None:
        return (status_of(api, name).get("podSet") or {}).get("members")

    async with running_operator(api) as operator:
        # Two sets of one member each: each is its own leader.
        await eventually(lambda: pod_set("a-member") == ["a-member"], "a-member's own set")
        await eventually(lambda: pod_set("b-member") == ["b-member"], "b-member's own set")

        # a-member takes b-member's selector: one set, led by a-member, ticking both.
        await patch_object(api, "a-member", {"spec": {"selector": spec(TRITON_LABELS)["selector"]}})
        for name in ("a-member", "b-member"):
            await eventually(
                lambda name=name: pod_set(name) == ["a-member", "b-member"],
                f"{name} in the joined set",
            )
        before = await ticks(operator, "b-member")
        await eventually_async(
            lambda: ticks(operator, "b-member"), lambda n: n >= before + 2, "the set ticking on"
        )

        # The leader goes: b-member's daemon leads its set now, alone.
        await delete_object(api, "a-member")
        await eventually(
            lambda: pod_set("b-member") == ["b-member"], "b-member leading its set alone"
        )
        after = await ticks(operator, "b-member")
        await eventually_async(
            lambda: ticks(operator, "b-member"), lambda n: n >= after + 2, "b-member ticking on"
        )
