"""pipeline_ensemble: the pipeline as a Triton ensemble, against the BLS pipelines it mirrors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.model_clients import PROTOCOLS, connect, infer, infer_concurrently, infer_error
from tests.test_pipeline import OUTPUTS, assert_identical, assert_well_formed, features

ENSEMBLE = "pipeline_ensemble"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_ensemble_gives_pipeline_syncs_outputs_bit_for_bit(triton, protocol, rows):
    batch = features(rows, seed=500 + rows)
    with connect(triton, protocol) as client:
        from_ensemble = infer(client, protocol, ENSEMBLE, {"FEATURES": batch}, OUTPUTS)
        from_sync = infer(client, protocol, "pipeline_sync", {"FEATURES": batch}, OUTPUTS)
    assert_well_formed(from_ensemble, rows)
    assert_identical(from_ensemble, from_sync)


def test_a_bad_request_in_a_concurrent_burst_fails_alone_in_the_first_step(triton):
    # The first step checks each request on its own, as the BLS pipelines do: its error
    # response is the ensemble's answer for that request, and the others go on.
    requests = [{"FEATURES": features(1, seed=600 + index)} for index in range(24)]
    requests[9]["FEATURES"][0, 2] = np.nan
    with connect(triton, "http") as client:
        expected = [
            infer(client, "http", "pipeline_sync", request, OUTPUTS)
            for index, request in enumerate(requests)
            if index != 9
        ]

    answers = infer_concurrently(triton, ENSEMBLE, requests, OUTPUTS)

    assert answers[9] == (
        f"in ensemble '{ENSEMBLE}', "
        "pipeline_preprocess: FEATURES must be finite, got 1 NaN or infinite value(s)"
    )
    for answer, want in zip(answers[:9] + answers[10:], expected, strict=True):
        assert not isinstance(answer, str), answer
        assert_identical(answer, want)


def test_a_wrong_width_is_refused_by_the_ensemble_itself(triton):
    with connect(triton, "http") as client:
        message = infer_error(client, "http", ENSEMBLE, {"FEATURES": features(2, seed=1)[:, :63]})
    assert "FEATURES" in message and "64" in message, message
