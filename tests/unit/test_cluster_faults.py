"""A Redis Cluster's faults are outages, not bugs (with one primary SIGSTOPped a
recall answered 500 with `ClusterDownError: The cluster is down`): the query service answers 503 with
Retry-After, and the retrying loops (worker lanes, start-up, the SDK) wait them out."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from redis import exceptions as redis_errors

from services.query.problems import _to_problem
from shared.retry import REDIS_FAULTS, TRANSIENT

FAULTS = [
    redis_errors.ClusterDownError("The cluster is down"),
    redis_errors.MasterDownError("MASTERDOWN Link with MASTER is down"),
    redis_errors.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    redis_errors.SlotNotCoveredError('Slot "42" is not covered by the cluster.'),
    redis_errors.ClusterError("TTL exhausted."),
    redis_errors.ConnectionError("Connection refused"),
    redis_errors.TimeoutError("Timeout reading from socket"),
]


@pytest.mark.parametrize("exc", FAULTS, ids=lambda e: type(e).__name__)
def test_a_cluster_fault_is_a_503_with_retry_after(exc):
    response = _to_problem(make_mocked_request("POST", "/v1/recall"), exc)
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    assert isinstance(exc, REDIS_FAULTS) and isinstance(exc, TRANSIENT)


@pytest.mark.parametrize(
    "exc",
    [
        redis_errors.ResponseError("ERR syntax error"),
        redis_errors.ClusterCrossSlotError(),
        RuntimeError("bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_bug_is_still_a_500_not_an_outage(exc):
    assert not isinstance(exc, REDIS_FAULTS)
    assert _to_problem(make_mocked_request("POST", "/v1/recall"), exc).status == 500
