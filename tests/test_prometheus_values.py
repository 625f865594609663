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


def test_a_window_without_a_sampled_step_has_no_per_unit_rows_not_zeros():
    """Issue 31: a window in which no rank sampled a step: every per-step expression is
    0/0 (NaN: absent) while `count` still counts the ranks' series. The per-unit stats then
    hold no row for that unit (not measured), never means of 0 over 2 ranks; a unit that
    was measured keeps its row."""
    from zerodoc.runmodel import RunSnapshot

    measured = {"unit": "layers.1", "phase": "forward", "collective": "all_gather"}
    empty = {"unit": "layers.0", "phase": "forward", "collective": "all_gather"}

    def answer(path, timeout_s=None, **params):
        q = params["query"]
        rows = [{"metric": empty, "value": [1.0, "2" if q.startswith("count by") else "NaN"]},
                {"metric": measured, "value": [1.0, "2" if q.startswith("count by")
                                               else "0.5"]}]
        return {"resultType": "vector", "result": rows}

    src = PrometheusSource.__new__(PrometheusSource)
    src.queries, src.timeout_s, src._get = 0, 5.0, answer
    got = src._unit_stats_of(src._raw_exprs(lambda name, extra="": f"increase({name}[60s])"),
                             None, (0, 1), RunSnapshot(source="test"))
    assert ("layers.0", "forward", "all_gather") not in got.comm
    row = got.comm[("layers.1", "forward", "all_gather")]
    assert row["seconds"].mean == 0.5 and row["seconds"].n == 2

