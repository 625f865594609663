"""What noting a collective's sequence number costs the training thread (issue 34: the step,
unit and phase a flight-recorder dump's collective came from; zerodoc/shim/collorder.py).

    python bench/collorder.py [--calls 4000]

A 1-rank gloo process group (127.0.0.1) and a real `CollOrder`: CPU nanoseconds per call
(`bench/hotpath_micro.CpuMeter`, the minimum over repeats) of
- `issued` (FSDP2's and FSDP1's all-gather, ZeRO-1's bucket all-reduce and broadcast);
- `begin` + `end` (DeepSpeed's every collective call, FSDP1's gradient reduction, a user's
  DDP comm hook: a call that may issue several collectives);
- `take` at a step's end, per row (54 rows: a ZeRO-1 step of the demo model);
and, per detail step, those costs times each engine's collectives in a step of the demo
model (tests/test_flightrec_engines.py's jobs: FSDP1 14, ZeRO-1 54, DeepSpeed ZeRO-3 20 on
the default group). Steps without per-unit detail enter none of it (the wrappers are not
installed). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hotpath_micro import CpuMeter  # noqa: E402

PER_STEP = {"fsdp1": (14, 0), "zero1": (54, 0), "deepspeed3": (0, 20)}  # (issued, begin/end)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=4000,
                   help="calls per timed loop (at most collorder.MAX_ROWS: a step's bound)")
    args = p.parse_args()
    import torch.distributed as dist

    from zerodoc.shim.collorder import MAX_ROWS, CollOrder
    from zerodoc.shim.recorder import ALL_GATHER, FORWARD

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    group = dist.group.WORLD

    class Rec:
        phase = FORWARD

    order, meter, n = CollOrder(Rec()), CpuMeter(), min(args.calls, MAX_ROWS)

    def base(k):
        for _ in range(k):
            pass

    def issued(k):
        order.items = []
        for _ in range(k):
            order.issued(group, 0, ALL_GATHER)

    def begin_end(k):
        order.items = []
        for _ in range(k):
            order.end(order.begin(group, 0, ALL_GATHER))

    loop = meter.per_call(base, n)
    res = {"issued_ns": meter.per_call(issued, n) - loop,
           "begin_end_ns": meter.per_call(begin_end, n) - loop}
    name = group.group_name
    seq = group._get_sequence_number_for_group()

    def take(k):
        for _ in range(k):
            order.items = [(group, seq, 0, FORWARD, ALL_GATHER)] * 54
            order.take({name: seq}, {name: seq + 54})
    res["take_per_row_ns"] = (meter.per_call(take, max(1, n // 54)) - loop) / 54
    res["per_detail_step_us"] = {
        eng: round((a * res["issued_ns"] + b * res["begin_end_ns"]
                    + (a + b) * res["take_per_row_ns"]) / 1e3, 1)
        for eng, (a, b) in PER_STEP.items()}
    res = {k: round(v, 1) if isinstance(v, float) else v for k, v in res.items()}
    dist.destroy_process_group()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
