"""Build (or load the cached build of) DeepSpeed's CPU shared-memory comm op, once.

    python tests/support/jobs/deepspeed_build_op.py

DS_ACCELERATOR defaults to `cpu`. Prints the seconds it took. Used by tests/test_deepspeed.py
before any two ranks start (two ranks compiling at once wait on a lock file).
"""

import os
import time


def main() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    t = time.time()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        builder.load(verbose=False)
    print(round(time.time() - t, 1))


if __name__ == "__main__":
    main()
