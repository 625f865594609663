"""attach() takes the monitor's CUDA branch on CPU, with torch.cuda.Event the stand-in's.

    python tests/support/jobs/cuda_branch.py RUN_DIR

Prints one line: `<monitor> <timer> <recorder> <enable_timing of each Event made> <attach
failures>`, e.g. `Monitor CudaTimer DeviceRecorder [True] []`. Used by tests/test_gpu_path.py.
"""

import sys
import warnings

import torch

from zerodoc.shim import cuda_memory
from zerodoc.shim import monitor as M
from zerodoc.testing.cudasim import Sim


class NoAllocator:
    def __init__(self, *a, **k):
        pass

    def __getattr__(self, n):
        return lambda *a, **k: None


def main() -> None:
    sim = Sim()
    M.Monitor._device_type = lambda self: "cuda"  # the branch a CUDA model takes
    cuda_memory.AllocatorReader = NoAllocator
    made = []
    torch.cuda.Event = lambda enable_timing=False: made.append(enable_timing) or sim.Event()
    import zerodoc

    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(m, torch.optim.SGD(m.parameters()), port=False, nvml=False,
                             run_dir=sys.argv[1])
    failed = [str(x.message) for x in w if "attach failed" in str(x.message)]
    if hasattr(mon, "rec"):
        mon.rec.pool.get()
    print(type(mon).__name__, type(getattr(mon, "timer", None)).__name__,
          type(getattr(mon, "rec", None)).__name__, made, failed)


if __name__ == "__main__":
    main()
