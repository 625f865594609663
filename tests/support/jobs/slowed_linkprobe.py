"""One rank of `zerodoc linkprobe` as torchrun starts it, over a link slowed beneath it.

    python -m tests.support.jobs.slowed_linkprobe DELAY_S MIN_BYTES linkprobe [ARGS...]

`torch.distributed.all_gather_into_tensor` sleeps DELAY_S before every call whose output is
MIN_BYTES or more (the ground truth the probe must see); RANK, WORLD_SIZE and MASTER_* come
from the environment. Used by tests/test_linkprobe.py.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    delay, min_bytes = float(sys.argv[1]), int(sys.argv[2])
    import torch.distributed as dist

    real = dist.all_gather_into_tensor

    def slowed(out, inp, *args, **kwargs):
        if out.numel() * out.element_size() >= min_bytes:
            time.sleep(delay)  # the subject: a link that costs DELAY_S more from MIN_BYTES
        return real(out, inp, *args, **kwargs)
    dist.all_gather_into_tensor = slowed
    from zerodoc.cli import main as cli

    return cli.main(sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
