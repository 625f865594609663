"""What the Prometheus source takes from a query's samples (no server: the HTTP answer is
given). A recorded per-step rule divides by the rate of sampled steps, 0/0 = NaN when its
window held none (adaptive K samples one step in up to 1024): NaN reads as no sample."""

from __future__ import annotations

from zerodoc.sources.prometheus import PrometheusSource


def _source(answer: dict) -> PrometheusSource:
    src = PrometheusSource.__new__(PrometheusSource)  # no server: `_get` answers
    src.queries = 0
    src._get = lambda path, timeout_s=None, **params: answer
    return src


def test_nan_and_infinite_samples_read_as_absent_never_as_numbers():
    answer = {"resultType": "vector", "result": [
        {"metric": {"unit": "layers.0", "phase": "forward"}, "value": [1.0, "NaN"]},
        {"metric": {"unit": "layers.1", "phase": "forward"}, "value": [1.0, "0.25"]},
        {"metric": {"unit": "layers.2", "phase": "forward"}, "value": [1.0, "0"]},
        {"metric": {"unit": "layers.3", "phase": "forward"}, "value": [1.0, "+Inf"]},
    ]}
    rows = _source(answer)._query("unit_job:zerodoc_framework_unit_seconds:per_step_mean")
    assert rows == [({"unit": "layers.1", "phase": "forward"}, 0.25),
                    ({"unit": "layers.2", "phase": "forward"}, 0.0)]
