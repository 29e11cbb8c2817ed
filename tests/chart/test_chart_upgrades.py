"""Upgrades that complete: what the chart renders for them, and how it behaves.

The peered operator's rollout must finish where its pods are kept on separate nodes and there
are as many nodes as replicas, with one operator active throughout; a rollout is replayed here
on the rendered strategy, anti-affinity and budget by a small model of the Deployment
controller and the scheduler. A headless Locust run must survive `helm upgrade` with a new
chart version, a changed locustfile and another worker count (a Job's pod template cannot be
patched), and every one of its waits must be bounded. tests/cluster/test_upgrades.py shows
both on a real API server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, Result, by_kind, container, one, template_args

HA_VALUES = "operator-ha-values.yaml"


# ---- the operator's rollout -----------------------------------------------------------------
def rollout_of(objects: list[dict]) -> dict:
    return one(objects, "Deployment", "-operator")["spec"]["strategy"]


def pods_of(count: int | str, replicas: int, round_up: bool) -> int:
    """A rollingUpdate number or percentage as pods, rounded as the Deployment controller does."""
    if isinstance(count, str) and count.endswith("%"):
        share = replicas * int(count[:-1])
        return -(-share // 100) if round_up else share // 100
    return int(count)


@dataclass
class Pod:
    new: bool
    node: str | None = None
    ready: bool = False
    terminating: bool = False


@dataclass
class Rollout:
    """A Deployment's rolling update on `nodes` nodes, one controller or scheduler pass a step.

    The controller scales the new ReplicaSet up while all pods (terminating ones excluded, as
    the controller counts them) stay within replicas + maxSurge, and the old one down while
    the available pods stay at replicas - maxUnavailable or more. The scheduler places a
    pending pod on a node where the required anti-affinity finds no operator pod, terminating
    ones included (they still run there). A placed pod is Ready a step later; a terminating
    one is gone a step later.
    """

    replicas: int
    max_surge: int
    max_unavailable: int
    nodes: int
    kept_apart: bool
    pods: list[Pod] = field(default_factory=list)
    fewest_available: int = 0

    def __post_init__(self) -> None:
        self.pods = [Pod(new=False, node=f"node-{i}", ready=True) for i in range(self.replicas)]
        self.fewest_available = self.replicas

    def available(self) -> int:
        return sum(p.ready and not p.terminating for p in self.pods)

    def done(self) -> bool:
        return [p.new and p.ready for p in self.pods] == [True] * self.replicas

    def step(self) -> None:
        self.pods = [p for p in self.pods if not p.terminating]  # the terminated ones are gone
        for pod in self.pods:  # placed last step: Ready now
            pod.ready = pod.ready or pod.node is not None
        counted = [p for p in self.pods if not p.terminating]
        new = [p for p in counted if p.new]
        if len(new) < self.replicas and len(counted) < self.replicas + self.max_surge:
            self.pods.append(Pod(new=True))
        old = [p for p in self.pods if not p.new and not p.terminating]
        if old and self.available() - 1 >= self.replicas - self.max_unavailable:
            old[0].terminating = True
        for pod in self.pods:
            if pod.node is None:
                taken = {p.node for p in self.pods if p.node is not None}
                free = [f"node-{i}" for i in range(self.nodes) if f"node-{i}" not in taken]
                if free or not self.kept_apart:
                    pod.node = free[0] if free else "node-0"
                break  # one pod per scheduling pass
        self.fewest_available = min(self.fewest_available, self.available())

    def run(self, steps: int = 100) -> bool:
        for _ in range(steps):
            if self.done():
                return True
            self.step()
        return self.done()


def replay(objects: list[dict], nodes: int) -> Rollout:
    deployment = one(objects, "Deployment", "-operator")
    replicas = deployment["spec"]["replicas"]
    update = deployment["spec"]["strategy"]["rollingUpdate"]
    anti = deployment["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
    rollout = Rollout(
        replicas=replicas,
        max_surge=pods_of(update["maxSurge"], replicas, round_up=True),
        max_unavailable=pods_of(update["maxUnavailable"], replicas, round_up=False),
        nodes=nodes,
        kept_apart=bool(anti.get("requiredDuringSchedulingIgnoredDuringExecution")),
    )
    rollout.run()
    return rollout


def test_the_replay_stalls_a_surge_rollout_of_pods_kept_apart_on_as_many_nodes() -> None:
    # What the shipped HA values rendered before: the surge pod finds no node, no old pod may
    # go, and the rollout never ends. The replay must see it, or it proves nothing below.
    stalled = Rollout(replicas=3, max_surge=1, max_unavailable=0, nodes=3, kept_apart=True)
    assert not stalled.run()
    assert [p.node for p in stalled.pods if p.new] == [None]


def test_the_ha_values_roll_out_on_three_nodes_with_two_replicas_always_up(render) -> None:
    objects = render(HA_VALUES).objects
    assert rollout_of(objects) == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    rollout = replay(objects, nodes=3)
    assert rollout.done(), f"the rollout stalled: {rollout.pods}"
    # Two up throughout: with peering one is active, the other ready to take over.
    assert rollout.fewest_available == 2


def test_a_rollout_never_takes_more_pods_than_the_budget_lets_a_drain_take(render) -> None:
    # The Deployment controller does not go through evictions: the two agree by values, and
    # while a rollout holds a pod down the budget lets no drain take another.
    objects = render(HA_VALUES).objects
    deployment = one(objects, "Deployment", "-operator")
    budget = one(objects, "PodDisruptionBudget", "-operator")["spec"]
    down = deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"]
    assert down <= deployment["spec"]["replicas"] - budget["minAvailable"]


def test_replicas_free_to_share_nodes_still_start_a_new_pod_before_an_old_one_goes(
    render,
) -> None:
    objects = render(HA_VALUES, sets=("operator.podAntiAffinity=preferred",)).objects
    assert rollout_of(objects)["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    rollout = replay(objects, nodes=3)
    assert rollout.done() and rollout.fewest_available == 3


def test_a_rollout_the_user_sets_is_rendered_as_given_with_percentages_quoted(render) -> None:
    objects = render(
        HA_VALUES,
        sets=("operator.rollingUpdate.maxSurge=0", "operator.rollingUpdate.maxUnavailable=34%"),
    ).objects
    assert rollout_of(objects)["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": "34%"}
    rollout = replay(objects, nodes=3)
    assert rollout.done() and rollout.fewest_available == 2


def test_an_affinity_of_the_users_own_leaves_the_rollout_to_the_user(render) -> None:
    # The chart cannot tell what a term of the user's selects: operator.affinity replaces its
    # anti-affinity, and the default rollout stays (the README says what to set).
    required = "operator.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    objects = render(
        HA_VALUES,
        sets=(
            f"{required}[0].topologyKey=kubernetes.io/hostname",
            f"{required}[0].labelSelector.matchLabels.app\\.kubernetes\\.io/component=operator",
        ),
    ).objects
    assert rollout_of(objects)["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


# ---- headless Locust runs across upgrades ---------------------------------------------------
LOCUST = "locust-values.yaml"


def locust_jobs(objects: list[dict]) -> dict[str, dict]:
    """role -> the headless run's Job."""
    return {
        job["metadata"]["labels"]["tritonscale.io/locust-role"]: job
        for job in by_kind(objects, "Job")
        if job["metadata"]["labels"].get("app.kubernetes.io/component") == "locust"
    }


def job_names(objects: list[dict]) -> dict[str, str]:
    return {role: job["metadata"]["name"] for role, job in locust_jobs(objects).items()}


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A copy of the chart with its links resolved, to edit as a new chart version would."""
    copy = tmp_path / "tritonscale"
    shutil.copytree(CHART, copy, symlinks=False)
    return copy


def render_copy(helm4: str, chart: Path, *sets: str) -> list[dict]:
    """`helm template` of the copy as it is now (not run_helm: its cache would not see an edit)."""
    done = subprocess.run(
        [helm4, *template_args(LOCUST, sets=sets, chart=chart)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return Result(done.returncode, done.stdout, done.stderr).objects


def test_a_headless_run_is_named_after_what_it_runs_and_the_service_follows_it(render) -> None:
    objects = render(LOCUST).objects
    jobs = locust_jobs(objects)
    runs = {job["spec"]["template"]["metadata"]["labels"]["tritonscale.io/locust-run"]
            for job in jobs.values()}  # fmt: skip
    (run,) = runs  # one run: a master never waits for workers of another
    assert job_names(objects) == {
        "master": f"demo-tritonscale-locust-master-{run}",
        "worker": f"demo-tritonscale-locust-worker-{run}",
    }
    service = one(objects, "Service", "-locust")
    assert service["spec"]["selector"]["tritonscale.io/locust-run"] == run
    assert job_names(render(LOCUST).objects) == job_names(objects)  # the same run renders alike


def _label_maps(obj: dict) -> list[dict]:
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("metadata") or {}
    selector = spec.get("selector") or {}
    maps = [obj["metadata"].get("labels"), template.get("labels"), selector.get("matchLabels")]
    if obj["kind"] == "Service":
        maps.append(selector)
    return [m for m in maps if m]


def test_label_values_stay_strings_whatever_their_characters(render) -> None:
    # A run's id is ten hex digits of a hash: all digits, or digits around one "e" (a float),
    # in about one render of fifty (the hash covers the image registry's address, the
    # values, the chart), and the API server refuses a label that is no string ("cannot
    # unmarshal number into Go struct field ObjectMeta.metadata.labels"): helm install
    # failed so on a fresh clone's CI run. A name or release of digits alike.
    result = render(LOCUST, extra=("--set-string", "nameOverride=123"))
    for obj in result.objects:
        for labels in _label_maps(obj):
            numbers = {k: v for k, v in labels.items() if not isinstance(v, str)}
            assert not numbers, (obj["kind"], obj["metadata"]["name"], numbers)
    runs = re.findall(r'tritonscale\.io/locust-run: ("?)[0-9a-f]{10}"?\n', result.stdout)
    assert runs and all(quote == '"' for quote in runs), runs


@pytest.mark.parametrize(
    "change",
    ["a new chart version", "a changed locustfile", "another worker count"],
)
def test_an_upgrade_that_changes_the_run_replaces_its_jobs_under_new_names(
    helm4: str, chart_copy: Path, change: str
) -> None:
    before = render_copy(helm4, chart_copy)
    sets: tuple[str, ...] = ()
    if change == "a new chart version":
        chart_yaml = chart_copy / "Chart.yaml"
        chart = yaml.safe_load(chart_yaml.read_text())
        chart_yaml.write_text(yaml.safe_dump({**chart, "version": "0.1.1"}))
    elif change == "a changed locustfile":
        bls = chart_copy / "files" / "loadtests" / "bls.py"
        bls.write_text(bls.read_text() + "\n# changed\n")
    else:
        sets = ("locust.workers=2",)
    after = render_copy(helm4, chart_copy, *sets)
    old, new = locust_jobs(before), locust_jobs(after)
    for role in ("master", "worker"):
        # The pod template differs, which the API server refuses to patch into a Job: the
        # new Job must have another name (and Helm deletes the old one, not in the release).
        assert new[role]["spec"]["template"] != old[role]["spec"]["template"], role
        assert new[role]["metadata"]["name"] != old[role]["metadata"]["name"], role


def test_an_upgrade_that_leaves_the_run_alone_keeps_its_jobs(helm4: str, chart_copy: Path) -> None:
    # A finished run is not run again, nor a running one restarted, by an unrelated upgrade.
    before = render_copy(helm4, chart_copy)
    after = render_copy(helm4, chart_copy, "triton.logVerbose=1", "operator.image.tag=9.9.9")
    assert job_names(after) == job_names(before)
    assert locust_jobs(after) == locust_jobs(before)


def test_the_run_is_made_of_release_objects_so_helm_does_not_wait_for_it(render) -> None:
    # Helm waits for hook Jobs to finish: a 10-minute run would hold `helm install` that long.
    for role, job in locust_jobs(render(LOCUST).objects).items():
        assert "helm.sh/hook" not in (job["metadata"].get("annotations") or {}), role


def test_every_wait_of_a_headless_run_is_bounded(render) -> None:
    jobs = locust_jobs(render(LOCUST).objects)
    master = jobs["master"]["spec"]["template"]["spec"]
    (wait,) = master["initContainers"]
    assert wait["command"][:2] == ["python3", "/opt/tritonscale/scripts/triton_ready.py"]
    assert "--wait=600" in wait["command"]
    assert "--expect-workers-max-wait=300" in container(jobs["master"], "locust")["args"]
    # runTime 10m: the waits for Triton and the workers, the run, two minutes to stop.
    for role, job in jobs.items():
        assert job["spec"]["activeDeadlineSeconds"] == 600 + 300 + 600 + 120, role
        assert "ttlSecondsAfterFinished" not in job["spec"], role  # kept, logs readable


def test_a_failed_wait_or_run_leaves_its_last_line_as_the_termination_message(render) -> None:
    master = locust_jobs(render(LOCUST).objects)["master"]["spec"]["template"]["spec"]
    for item in [*master["initContainers"], *master["containers"]]:
        assert item["terminationMessagePolicy"] == "FallbackToLogsOnError", item["name"]


def test_the_bounds_and_the_cleanup_follow_their_values(render) -> None:
    jobs = locust_jobs(
        render(
            LOCUST,
            sets=(
                "locust.waitForTritonSeconds=30",
                "locust.expectWorkersSeconds=20",
                "locust.runTime=1h2m3s",
                "locust.ttlSecondsAfterFinished=3600",
            ),
        ).objects
    )
    for role, job in jobs.items():
        assert job["spec"]["activeDeadlineSeconds"] == 30 + 20 + 3723 + 120, role
        assert job["spec"]["ttlSecondsAfterFinished"] == 3600, role
    init = jobs["master"]["spec"]["template"]["spec"]["initContainers"][0]
    assert "--wait=30" in init["command"]
    explicit = locust_jobs(render(LOCUST, sets=("locust.activeDeadlineSeconds=900",)).objects)
    assert {job["spec"]["activeDeadlineSeconds"] for job in explicit.values()} == {900}


def test_the_web_ui_keeps_its_deployments_without_a_run_id(render) -> None:
    objects = render(sets=("locust.enabled=true",)).objects
    assert locust_jobs(objects) == {}
    service = one(objects, "Service", "-locust")
    assert "tritonscale.io/locust-run" not in service["spec"]["selector"]
    assert one(objects, "Deployment", "-locust-master")["metadata"]["name"] == (
        "demo-tritonscale-locust-master"
    )


def test_values_kept_from_a_release_before_these_keys_still_bound_every_wait(render) -> None:
    # `helm upgrade --reuse-values` keeps the old chart's defaults (Helm 3 and 4): the new keys
    # are then missing, and a wait of 0 would be Locust's forever.
    missing = ("waitForTritonSeconds", "expectWorkersSeconds", "activeDeadlineSeconds",
               "ttlSecondsAfterFinished")  # fmt: skip
    objects = render(LOCUST, sets=tuple(f"locust.{key}=null" for key in missing)).objects
    jobs = locust_jobs(objects)
    init = jobs["master"]["spec"]["template"]["spec"]["initContainers"][0]
    assert "--wait=600" in init["command"]
    assert "--expect-workers-max-wait=300" in container(jobs["master"], "locust")["args"]
    for role, job in jobs.items():
        assert job["spec"]["activeDeadlineSeconds"] == 600 + 300 + 600 + 120, role
        assert "ttlSecondsAfterFinished" not in job["spec"], role
    kept = render(HA_VALUES, sets=("operator.rollingUpdate=null",)).objects
    assert rollout_of(kept)["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
