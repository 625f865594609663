"""A demo rank whose all-gathers block in the call.

    python -m tests.support.jobs.blocking_link SPEC

A slow link that stalls the *call* (not just the completion, as `zerodoc/shim/slowlink.py`
does): `torch.distributed.all_gather_into_tensor` sleeps `spec["block_call_s"]` before it
issues the collective, asynchronous or not, beneath DeepSpeed and beneath zerodoc (patched
before DeepSpeed binds its backend to it). Used by tests/test_deepspeed.py (issue 20 item 9).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    spec = json.loads(sys.argv[1])
    delay = float(spec.pop("block_call_s", 0.0))
    if delay > 0:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        orig = c10d.all_gather_into_tensor

        def all_gather_into_tensor(*args, **kwargs):
            time.sleep(delay)  # the subject: the slow link blocks the call itself
            return orig(*args, **kwargs)
        dist.all_gather_into_tensor = c10d.all_gather_into_tensor = all_gather_into_tensor
    sys.argv[1] = json.dumps(spec)
    from zerodoc.demo.worker import main as worker_main

    worker_main()


if __name__ == "__main__":
    main()
