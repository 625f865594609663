"""HTA's (HolisticTraceAnalysis) numbers on trace directories, the witness zerodoc's trace
reader is checked against in tests/test_trace_hta.py.

    python tests/support/jobs/hta_overlap.py CASES_JSON STEPS [per-step]

CASES_JSON: {name: trace directory}. STEPS: `all` includes the last profiler step, anything
else leaves it out (HTA's default). Prints one line `RESULT{json}`:
- by default, per case and rank, HTA's overall computation/communication overlap (%);
- with `per-step` (the last profiler step always included), per case and rank
  {"overlap": HTA's overall overlap, "steps": {profiler step: {"seconds", "compute", "comm",
  "exposed"}}}: HTA's own numbers on the kernels inside each ProfilerStep#N window (a trace
  without step markers: one window over all its events, step 0, "seconds" null) (compute
  from its temporal breakdown, comm from `merge_kernel_intervals` on the kernels it types as
  communication, exposed = comm x (1 - its overlap)).
"""

import json
import sys

from hta.trace_analysis import TraceAnalysis


def overall(cases: dict, last_step: bool) -> dict:
    out = {}
    for name, d in cases.items():
        df = TraceAnalysis(trace_dir=d, include_last_profiler_step=last_step) \
            .get_comm_comp_overlap(visualize=False)
        out[name] = {int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}
    return out


def step_numbers(ta, sym, rank, df) -> dict:
    import numpy as np
    from hta.utils.utils import KernelType, get_kernel_type, merge_kernel_intervals

    t = ta.t
    names = df["name"].map(lambda i: sym[i])
    gpu = df[df["stream"].ne(-1)]
    steps = {}
    # the host's step spans (a trace may repeat them on the device: gpu_user_annotation)
    host = df["cat"].map(lambda i: sym[i]).ne("gpu_user_annotation")
    marks = [(int(sym[s["name"]].split("#")[1]), s["ts"], s["ts"] + s["dur"])
             for _, s in df[names.str.startswith("ProfilerStep#") & host].iterrows()]
    if not marks:  # no step markers: the whole trace is one window, step 0 (as zerodoc's)
        marks = [(0, df["ts"].min(), (df["ts"] + df["dur"]).max())]
    for number, lo, hi in marks:
        secs = float(hi - lo) * 1e-6 if number or len(marks) > 1 else None
        k = gpu[(gpu["ts"] < hi) & (gpu["ts"] + gpu["dur"] > lo)].copy()
        end = np.minimum(k["ts"] + k["dur"], hi)
        k["ts"] = np.maximum(k["ts"], lo)
        k["dur"] = end - k["ts"]
        if k.empty:  # HTA's breakdown needs a kernel
            steps[number] = {"seconds": secs, "compute": 0.0, "comm": 0.0, "exposed": 0.0}
            continue
        t.traces = {rank: k}
        tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
        kinds = k["name"].map(lambda i: get_kernel_type(sym[i]))
        comm = merge_kernel_intervals(k[kinds.eq(KernelType.COMMUNICATION.name)].copy())
        comm_us = float((comm["end"] - comm["ts"]).sum())
        ov = ta.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"] \
            if comm_us else 0.0
        steps[number] = {
            "seconds": secs,
            "compute": float(tb["compute_time(us)"]) * 1e-6, "comm": comm_us * 1e-6,
            "exposed": comm_us * (1 - float(ov) / 100) * 1e-6}
    return steps


def per_step(cases: dict) -> dict:
    out = {}
    for name, d in cases.items():
        ta = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
        t = ta.t
        sym = t.symbol_table.get_sym_table()
        traces = dict(t.traces)
        overlap = ta.get_comm_comp_overlap(visualize=False)
        overlap = dict(zip(overlap["rank"], overlap["comp_comm_overlap_pctg"]))
        ranks = {}
        for rank, df in traces.items():
            steps = step_numbers(ta, sym, rank, df)
            t.traces = traces
            ranks[int(rank)] = {"overlap": float(overlap[rank]), "steps": steps}
        out[name] = ranks
    return out


def main() -> None:
    cases = json.loads(sys.argv[1])
    if sys.argv[3:] == ["per-step"]:
        out = per_step(cases)
    else:
        out = overall(cases, sys.argv[2] == "all")
    print("RESULT" + json.dumps(out))


if __name__ == "__main__":
    main()
