"""One job identity that every rank and node derives alike, for any launcher: the sampled
steps' seed (`sampler.py`), the default run directory's name (`./zerodoc-runs/<job id>/`) and
the run header's `job_id` (a later check refuses a second live job in one directory by it).
A stable string: the same launch gives the same string on every rank, at every attach.

Where it comes from, the first that is there:

| source                         | identity                  | why it is job-wide            |
|--------------------------------|---------------------------|-------------------------------|
| $ZERODOC_RUN_ID                | its value                 | the user's, given to every rank |
| $TORCHELASTIC_RUN_ID (not "none") | its value              | torchrun's rendezvous id (c10d / --standalone); static torchrun says "none" |
| $SLURM_JOB_ID + $SLURM_STEP_ID | slurm-<job>.<step>        | an srun step's tasks share both; without a step id (a batch script running torchrun) the job id alone would be shared by consecutive runs of the allocation, so it is not used |
| $PMIX_NAMESPACE                | pmix-<namespace>          | PMIx's name of the job (Open MPI 5 / PRRTE, srun --mpi=pmix) |
| $OMPI_MCA_ess_base_jobid       | ompi-<jobid>              | Open MPI <= 4 (ORTE) sets the job's id in every process it starts |
| torch.distributed initialised  | the first writer's candidate in the default group's store | `compare_set` of one key: every rank reads back the value the first rank to get there wrote; no rank waits for another |
| $RANK set (a launcher started us) | <launcher start>-<launcher pid> | the parent's start time: one launcher, one node |
| none of these                  | <time>-<host>-<pid>        | a single process              |

MPICH / Intel MPI (Hydra) set PMI_RANK, PMI_SIZE, PMI_FD / PMI_PORT: per process or per node,
none job-wide; those jobs get their identity from the store. Values are made path-safe
(letters, digits, `.`, `_`, `-`; others become `-`), at most MAX_LEN characters.
"""

from __future__ import annotations

import os
import re
import socket
import time

MAX_LEN = 120
STORE_KEY = "zerodoc/job_id"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe(value: str) -> str:
    """`value` as one path component: unsafe characters as '-', at most MAX_LEN long."""
    s = _UNSAFE.sub("-", value.strip()).strip(".-")[:MAX_LEN]
    return s or "run"


def from_env(env) -> str | None:
    """The identity a launcher or the user put in the environment, or None."""
    v = env.get("ZERODOC_RUN_ID", "")
    if v:
        return safe(v)
    v = env.get("TORCHELASTIC_RUN_ID", "")
    if v and v != "none":
        return safe(v)
    job, step = env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "")
    if job and step:
        return safe(f"slurm-{job}.{step}")
    for var, prefix in (("PMIX_NAMESPACE", "pmix"), ("OMPI_MCA_ess_base_jobid", "ompi")):
        v = env.get(var, "")
        if v:
            return safe(f"{prefix}-{v}")
    return None


def from_store(store, candidate: str) -> str | None:
    """Agree through a c10d store without waiting for any rank: `compare_set` of STORE_KEY
    from empty to this process's candidate sets it when no rank has yet and returns the
    value in the store either way, the first writer's. None when the store cannot."""
    try:
        got = store.compare_set(STORE_KEY, "", candidate)
        v = got.decode("utf-8", "replace") if isinstance(got, bytes) else str(got)
        return safe(v) if v else None
    except Exception:  # noqa: BLE001 - a store without compare_set, or gone: fail soft
        return None


def _launcher_start(ppid: int) -> str | None:
    """Start time of the launcher (parent) process: the same for every rank it started."""
    try:
        with open(f"/proc/{ppid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    start = btime + ticks / os.sysconf("SC_CLK_TCK")
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(start)) + f"-{ppid}"


def candidate() -> str:
    """This process's own identity: what it proposes to the store, or uses alone."""
    return safe(time.strftime("%Y%m%d-%H%M%S") + f"-{socket.gethostname()}-{os.getpid()}")


def job_id(env=None, registry=None) -> str:
    """The job identity (module docstring). `registry`: where a missing store hook point
    is reported (`HookRegistry.missing`)."""
    env = os.environ if env is None else env
    v = from_env(env)
    if v:
        return v
    from . import hookpoints as hp

    try:
        store = hp.default_store()
    except Exception as e:  # noqa: BLE001 - private: fail soft
        store = None
        if registry is not None:
            registry.missing("distributed_c10d._get_default_store", repr(e))
    if store is not None:
        v = from_store(store, candidate())
        if v:
            return v
    if "RANK" in env:  # launched: siblings share the launcher
        v = _launcher_start(os.getppid())
        return safe(v or f"ppid{os.getppid()}")
    return candidate()
