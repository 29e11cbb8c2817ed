"""shared_lock: IN [1] -> OUT [1] (OUT = IN), holding each request `hold_ms`.

With `shared_lock` "true" the hold happens under one lock that every instance of the model
takes: the instances run one at a time, whatever their count, as instances behind one shared
resource do (a GPU, a lock, a connection pool). Each waiting instance is still inside
`execute`, busy in Triton's eyes.

The lock is fair (first come, first served). A plain `fcntl.flock` is not: an instance that
releases it and asks again at once may win it back over and over, and an instance Triton is
removing then waits behind the survivors with its last request for minutes, so its unload
(a scale-down) never finishes. Tickets give each instance its turn in the order it asked.
"""

import fcntl
import json
import os
import time
from contextlib import contextmanager

import triton_python_backend_utils as pb_utils

POLL_S = 0.001


class TicketLock:
    """A first-come-first-served lock across processes: a ticket counter, the ticket now
    served and each waiting ticket's process id, in one small file read and written under a
    short `flock`. A ticket whose process died is skipped, so a killed stub blocks nobody."""

    def __init__(self, path):
        self.path = path

    @contextmanager
    def held(self):
        ticket = self._update(self._take)
        while not self._update(lambda state: self._my_turn(state, ticket)):
            time.sleep(POLL_S)
        try:
            yield
        finally:
            self._update(lambda state: self._give_back(state, ticket))

    def _update(self, change):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        with os.fdopen(fd, "r+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes
            text = file.read()
            state = json.loads(text) if text else {"next": 0, "serving": 0, "owners": {}}
            before = json.dumps(state, sort_keys=True)
            result = change(state)
            after = json.dumps(state, sort_keys=True)
            if after != before:
                file.seek(0)
                file.truncate()
                file.write(after)
            return result

    @staticmethod
    def _take(state):
        ticket = state["next"]
        state["next"] += 1
        state["owners"][str(ticket)] = os.getpid()
        return ticket

    @staticmethod
    def _my_turn(state, ticket):
        while state["serving"] < ticket:
            owner = state["owners"].get(str(state["serving"]))
            if owner is not None and _alive(owner):
                return False
            state["owners"].pop(str(state["serving"]), None)
            state["serving"] += 1
        return state["serving"] == ticket

    @staticmethod
    def _give_back(state, ticket):
        state["owners"].pop(str(ticket), None)
        state["serving"] = max(state["serving"], ticket + 1)


def _alive(pid):
    """Whether the process runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.hold_s = float(parameters["hold_ms"]["string_value"]) / 1000.0
        locked = parameters["shared_lock"]["string_value"] == "true"
        path = os.path.join(args["model_repository"], "shared.lock")
        self.lock = TicketLock(path) if locked else None

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.lock is not None:
                with self.lock.held():
                    time.sleep(self.hold_s)
            else:
                time.sleep(self.hold_s)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)])
            )
        return responses
