"""The in-job monitor behind `zerodoc.attach()` (the facade in `zerodoc/__init__.py` carries
the full docstring).

Lifecycle: discover the sharded units, install instrumentation, hook the optimizer's step
(step boundaries), then at each step end: drain the recorder, fold the step into the
cumulative totals the exporter serves, append one run-log line. Every zerodoc failure after
attach is caught, counted (`zerodoc_errors_total{hook}`) and the job carries on.
"""

from __future__ import annotations

import atexit
import bisect
import os
import socket
import sys
import threading
import time
import warnings
from time import perf_counter, process_time, thread_time

import torch.distributed as dist

from ..version import __version__
from ..catalog import STEP_BUCKETS
from .config import AttachConfig
from ..runmodel import CommTotals, RankFacts, RankWindow
from ..runlog import DEFAULT_ROOT, RunLogWriter
from . import adapters, faults, guards, jobid, memory, signals
from .guards import NullMonitor  # what attach() returns when it does not attach
from . import hookpoints as hp
from . import collorder
from .collorder import CollOrder
from .comm import HostTimer
from .sampler import Sampler, SeqCounter
from .wiring import torch_version
from .recorder import (
    B_FRAMEWORK, B_OPTIMIZER, B_OTHER, B_WAIT, COLLECTIVES, FORWARD, OPTIMIZER, PHASES,
    Recorder, unit_bucket,
)


MEMORY_READ_S = 1.0  # memory populations re-read at most this often between walk steps
TERM_WAIT_S = 5.0  # a SIGTERM's recording delays the end of the process at most this long


def attach(model, optimizer=None, **options):
    cfg = AttachConfig.from_options(**options)  # bad options raise here, at attach time
    if not cfg.enabled:
        return NullMonitor("disabled")
    guards.check_arguments(model, optimizer)  # bad arguments too (TypeError)
    attached = guards.existing_monitor(model, optimizer, stacklevel=4)
    if attached is not None:  # one monitor per process: never two writers of one rank log
        return attached
    try:
        return Monitor(model, optimizer, cfg)
    except Exception as e:  # zerodoc must never take the job down
        warnings.warn(f"zerodoc: attach failed ({e!r}); training continues unmonitored",
                      stacklevel=2)
        return NullMonitor(repr(e))


def _rank_info() -> tuple[int, int, int, int]:
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return rank, local_rank, world, local_world


class Monitor:
    def __init__(self, model, optimizer, cfg: AttachConfig):
        self.cfg = cfg
        self.registry = hp.HookRegistry()
        self.model, self.optimizer = model, optimizer
        self.rank, self.local_rank, self.world_size, self.local_world_size = _rank_info()
        self.node = socket.gethostname()
        self.step_index = 0
        self._closed = False
        self._t_attach = perf_counter()
        self._step_start: float | None = None
        self._pending_self_s = 0.0
        self._mem_static: dict[str, int] = {}
        self._unit_slots: tuple | None = None  # step-end loops over unit buckets (_slots)
        self._comm_keys: dict = {}  # (unit, phase, coll) -> run-log row head, totals key
        self._folds = 0  # folds into the totals so far (the exporter's cache key)
        self._undo: list = []
        self._unit_undo: list = []  # removes the per-unit instrumentation (detail steps)
        self._plan = None  # that instrumentation built once (detailplan.py), or None
        self._detail_on = False  # the per-unit hooks and wrappers are installed
        self._cpu_mark = thread_time()  # the training thread's CPU clock at the last step end
        self._cpu_carry = 0.0  # install cost paid at a step end, for the step it serves
        self._proc_mark = process_time()  # the process's (all its threads), likewise
        self._proc_carry = 0.0
        self._step_ev: list = []  # GPU: (step, event) at step boundaries, not yet read back
        self._device_step: tuple[int, float] | None = None
        self._mem: dict[str, int] | None = None  # the latest memory read (never mutated)
        self._mem_t = 0.0  # perf_counter() of that read
        self._errors_n = 0
        self._errors_snap: dict[str, int] = {}
        self._t_opt: float | None = None  # optimizer start on a step without detail
        self._root_hook = None  # the root pre-hook's handle until step 1 ends
        self._tail = True  # GPU: a detail step's events may be left to read back

        self.adapter = adapters.detect(model, optimizer, self.registry)
        self.adapter.discover()
        problems = []  # the user's set-up mistakes: warned on rank 0, kept in the header
        if not self.adapter.unit_names and self.adapter.framework == "none":
            problems.append(guards.problem("no-sharded-units", guards.no_units_message(model),
                                           guards.ATTACH_AFTER))
        opt_problem = guards.optimizer_problem(model, optimizer, self.adapter.framework)
        self._warned_optimizer = bool(opt_problem)
        if opt_problem:
            problems.append(guards.problem("optimizer-holds-no-model-parameters", opt_problem,
                                           guards.OPTIMIZER_FIX))
        if self.rank == 0:
            for p in problems:
                warnings.warn(p["message"], stacklevel=4)
        self.device_type = self._device_type()
        self.oom = self.nvml = self.allocator = None
        inject = faults.announce(cfg.inject_latency_s, self.device_type)
        if self.device_type == "cuda":
            from . import cuda, cuda_memory

            self.rec, self.timer = cuda.device_timing(len(self.adapter.unit_names),
                                                      self.registry)
            self.allocator = cuda_memory.AllocatorReader(cfg.reset_peak_memory)
        else:
            self.rec = Recorder(len(self.adapter.unit_names))
            self.timer = HostTimer(self.rec, self.registry, cfg.completion_callbacks)
        info = self.adapter.facts()
        self._inject = inject
        # One job identity every rank derives alike (jobid.py): the default run directory's
        # name and the sampler's seed.
        self.job_id = jobid.job_id(registry=self.registry)
        self.run_dir = os.fspath(cfg.run_dir) if cfg.run_dir else \
            os.path.join(DEFAULT_ROOT, self.job_id)
        # Tiers (sampler.py): seeded by the job identity, the same on every rank. Fault
        # injection lives beneath the comm wrappers: a run that injects is a diagnostic run,
        # every step.
        self.sampler = Sampler("every" if inject > 0 else cfg.detail, self.job_id,
                               floor_s=cfg.detail_floor_s, cap=cfg.detail_cap)
        self.seq = SeqCounter(self.registry)
        # each detail step's collectives by sequence number (collorder.py): the wrappers
        # find it on the timer; written as a `collorder` record when it changes
        self.order = self.timer.order = CollOrder(self.rec, self.registry)
        self._order: tuple = ((), {})  # (group names, order) last written
        self._install_root_hook()
        self._undo += self.adapter.install_always(self.rec, self.timer)
        self._detail_plan()  # built now: a sample's install only puts it in place
        if self.sampler.due(1):
            self._install_detail()
        elif self.timer.device:
            self.rec.pause()
        self.optimizer = self.adapter.step_optimizer()
        self._install_optimizer_hooks()

        self.unit_names = list(self.adapter.unit_names)
        self.capacity = self._capacity()
        self.endpoint: str | None = None
        self._server = None

        self._writer = None
        self._target = None  # this rank's file_sd target file, once written
        self._unwritable: str | None = None  # why the run directory cannot be written
        if cfg.run_log:
            try:
                self._writer = RunLogWriter(
                    self.run_dir, self.rank, every_steps=cfg.run_log_every,
                    every_seconds=cfg.run_log_every_seconds, detail=cfg.run_log_detail,
                    queue_size=cfg.run_log_queue, on_error=self.registry.error,
                    job_id=self.job_id)
            except OSError as e:  # the user's configuration, not a zerodoc error
                self._unwritable = e.strerror or str(e)
                self._config_warning(
                    f"zerodoc: cannot write the run directory {self.run_dir} "
                    f"({self._unwritable}); no run log from this job. Set run_dir= or "
                    "ZERODOC_RUN_DIR to a writable directory.")
        if cfg.port is not False:
            from ..exporter.server import serve
            self._server, self.endpoint = serve(self, cfg.port, cfg.host)

        extra = dict(info.extra)
        extra["compute_clock"] = "device" if self.device_type == "cuda" else "host"
        extra["fault_injection"] = inject > 0
        extra["sampling"] = self.sampler.header()
        extra["inject_latency_s"] = inject  # the delay in force (0: none, or ignored)
        try:  # the name a wrap fix gives the model's blocks (ZD001 / ZD002)
            extra["block_container"] = guards.block_container(model)
        except Exception as e:  # noqa: BLE001 - a hint, never into the job
            self.registry.error("block_container", e)
        if self.device_type == "cuda":
            self._start_gpu_observers()
            if self.nvml is not None:
                extra["link"] = self.nvml.link_class  # the slow-link rule's expectation
        self.facts = RankFacts(
            rank=self.rank, local_rank=self.local_rank, world_size=self.world_size,
            local_world_size=self.local_world_size, node=self.node,
            run_id=os.path.basename(os.path.normpath(self.run_dir)),
            framework=info.framework, framework_version=info.framework_version,
            torch_version=torch_version(),
            device_type=self.device_type,
            backend=dist.get_backend() if dist.is_available() and dist.is_initialized()
            else "none",
            zero_stage=info.zero_stage, mesh_shape=info.mesh_shape,
            mesh_dim_names=info.mesh_dim_names, param_dtype=info.param_dtype,
            reduce_dtype=info.reduce_dtype,
            units=tuple(info.units),
            device_capacity_bytes=self.capacity, started_unix=time.time(), pid=os.getpid(),
            metrics_endpoint=self.endpoint, hooks=dict(self.registry.status),
            job_id=self.job_id,
            config={**cfg.as_dict(), "zerodoc_version": __version__, **extra,
                    **({"attach_warnings": problems} if problems else {})},
        )
        self.totals = RankWindow(facts=self.facts, detail_steps=0)  # counted at detail steps
        self.seq.start()
        self.hist_counts = [0] * len(STEP_BUCKETS)
        if self._writer is not None:
            self._writer.write_header(self.facts)
        from .watchdog import Watchdog  # records stalls, and failures at close

        self.watchdog = Watchdog(self, cfg.stall_after_s)
        if cfg.stall_after_s > 0:
            self.watchdog.start()
        if self.endpoint:
            # Prometheus file_sd target for this rank; removed again by a clean close() (or
            # at interpreter exit), so a rank that dies leaves its target behind and its `up`
            # goes to 0 (alertable).
            self._write_target()
        if self.rank == 0:
            guards.say(guards.startup_line(self, problems))
        guards.register(self)
        # A job that forgets close() still ends its run log and removes its target.
        atexit.register(self._at_exit)
        # A SIGTERM (preemption, the scheduler) is recorded before the process ends by it.
        self._undo_signal = signals.install(self._terminated)

    def _config_warning(self, msg: str) -> None:
        """A problem of the user's set-up on this node: warned once per node (local rank 0),
        not counted as a zerodoc error."""
        if self.local_rank == 0:
            warnings.warn(msg, stacklevel=5)

    def _write_target(self) -> None:
        from ..exporter.targets import FILE_SD_DIR_ENV, target_path, write_rank_target

        if self._unwritable and not os.environ.get(FILE_SD_DIR_ENV):
            return  # the run directory was already found unwritable (warned once)
        if getattr(self._writer, "other_job", None) and not os.environ.get(FILE_SD_DIR_ENV):
            return  # another live job's run directory: its rank targets are not ours
        try:
            self._target = write_rank_target(self.run_dir, self.facts)
        except OSError as e:  # unwritable: the user's configuration
            self._config_warning(
                f"zerodoc: cannot write the Prometheus file_sd target "
                f"{target_path(self.run_dir, self.facts)} ({e.strerror or e}); Prometheus "
                "will not discover this job's ranks by file_sd.")
        except Exception as e:  # never into the job
            self.registry.error("file_sd", e)

    # --- set-up helpers -------------------------------------------------------------
    def _device_type(self) -> str:
        try:
            p = next(self.adapter.memory_module().parameters())
            p = p.to_local() if hasattr(p, "to_local") else p
            return p.device.type
        except (StopIteration, AttributeError):
            return "cpu"

    def _capacity(self) -> int | None:
        if self.device_type == "cuda":
            from . import cuda_memory

            return cuda_memory.capacity_bytes()
        host = memory.host_memory_bytes()
        return host // max(1, self.local_world_size) if host else None

    def _install_optimizer_hooks(self) -> None:
        opt = self.optimizer
        if opt is None:
            return
        try:
            h1 = opt.register_step_pre_hook(self._opt_pre)
            h2 = opt.register_step_post_hook(self._opt_post)
            self._undo += [h1.remove, h2.remove]
            self.registry.ok("Optimizer.register_step_pre_hook/post_hook")
        except Exception as e:
            self.registry.missing("Optimizer.register_step_pre_hook/post_hook", repr(e))
            self.optimizer = None

    def _start_gpu_observers(self) -> None:
        from . import cuda_memory

        try:
            self.oom = cuda_memory.OOMObserver(self.run_dir, self.rank, self.registry,
                                        self.cfg.memory_history)
        except Exception as e:
            self.registry.error("oom_observer", e)
        if self.cfg.nvml:
            from .nvml import NvmlSampler

            self.nvml = NvmlSampler.start(self.registry)

    # --- tiers: per-unit instrumentation on detail steps only ---------------------------
    def _install_root_hook(self) -> None:
        """Until the first step ends: the first step starts at the model's first forward (on
        detail steps the adapter's root hook, which runs before this one, does the same
        first). Removed at the first step end (`_first_step_end`): every later step starts
        at the previous one's end, so from step 2 on a step without detail enters nothing of
        zerodoc inside forward and backward. Not with no sharded units (framework "none"):
        its first step starts at attach, as it always did (a `step(closure)` job runs its
        forward inside the step)."""
        if self.adapter.framework == "none":
            return
        try:
            h = self.model.register_forward_pre_hook(self._root_pre, prepend=True)
            self._root_hook = h
            self._undo.append(h.remove)
        except Exception as e:  # noqa: BLE001 - not a module (the first step starts at attach)
            self.registry.missing("root forward pre-hook", repr(e))

    def _first_step_end(self) -> None:
        """The end of step 1: the always-on root pre-hook has done its only job (a handle
        removed twice, here and at close, is a no-op); rank 0's first-step checks."""
        h, self._root_hook = self._root_hook, None
        if h is not None:
            try:
                h.remove()
            except Exception as e:  # noqa: BLE001 - never into the job
                self.registry.error("root forward pre-hook", e)
        if self.rank == 0:
            self._first_step_checks()

    def _root_pre(self, mod, args) -> None:
        if self._step_start is None:
            self._on_root_forward()

    def _detail_plan(self):
        """The adapter's per-unit instrumentation, built once (`detailplan.py`; at attach),
        again only if the recorder or timer was replaced or someone else changed what it
        wraps since (its install refuses: `DetailPlan.stale`). None: the adapter has no plan
        (`instrument()`)."""
        plan = self._plan
        if plan is not None and plan.rec is self.rec and plan.timer is self.timer:
            return plan
        if plan is not None and plan.installed:  # never orphan hooks that are in place
            plan.remove(self._remove_error)
        try:
            plan = self.adapter.plan(self.rec, self.timer, self._on_root_forward,
                                     self._inject)
        except Exception as e:
            self.registry.error("detail.plan", e)
            plan = None
        self._plan = plan
        return plan

    def _install_detail(self) -> None:
        """Install the adapter's per-unit hooks and comm wrappers (a detail step begins)."""
        try:
            plan = self._detail_plan()
            if plan is not None:
                if not plan.install():  # built over what someone else changed since
                    self._plan = None
                    plan = self._detail_plan()
                    if plan is None or not plan.install():
                        raise RuntimeError("the per-unit instrumentation cannot be installed")
            else:
                self._unit_undo = self.adapter.instrument(self.rec, self.timer,
                                                          self._on_root_forward, self._inject)
            self._detail_on = True
        except Exception as e:
            self.registry.error("detail.install", e)
            self._remove_detail()
        if self.timer.device:
            self.rec.resume()

    def _remove_detail(self) -> None:
        """Take them out again (a detail step ended and the next one is not): outside detail
        steps they are not entered at all."""
        undo, self._unit_undo = self._unit_undo, []
        self._detail_on = False
        self._tail = True  # its events may still be read back (`_end_lean`)
        plan = self._plan
        if plan is not None and plan.installed:
            plan.remove(self._remove_error)
        for fn in reversed(undo):
            try:
                fn()
            except Exception as e:
                self.registry.error("detail.remove", e)
        if self.timer.device:
            self.rec.pause()

    def _remove_error(self, e: BaseException) -> None:
        self.registry.error("detail.remove", e)

    # --- hooks ------------------------------------------------------------------------
    def _on_root_forward(self) -> None:
        self.rec.phase = FORWARD
        if self._step_start is None:  # first step starts at the first forward
            now = perf_counter()
            self._step_start = now
            self.rec.reset(now)
            if self.timer.device:
                self._step_event(0)

    def _opt_pre(self, opt, args, kwargs):
        if not (kwargs or self._detail_on) and (not args or (len(args) == 1 and
                                                       args[0] is opt)):
            # A step without detail, `optimizer.step()` with no closure (torch passes the
            # optimizer itself in `args`): its time from one clock read here and one in
            # `_opt_post`, not through the recorder's stack.
            self.rec.phase = OPTIMIZER
            self._t_opt = perf_counter()
            if self._memory_due(self.step_index + 1):
                try:
                    self._mem_static["gradients"] = memory.gradient_bytes(
                        self.adapter.memory_module())
                except Exception as e:
                    self.registry.error("optimizer.pre_hook", e)
            return None
        self._t_opt = None
        try:
            self.rec.phase = OPTIMIZER
            self.rec.push(B_OPTIMIZER)
            if self._memory_due(self.step_index + 1):
                self._mem_static["gradients"] = memory.gradient_bytes(self.adapter.memory_module())
            # step(closure): forward and backward run inside step() (Lightning, LBFGS); the
            # closure is wrapped so that its time is not counted as optimizer time.
            closure = kwargs.get("closure") if kwargs else None
            if callable(closure):
                return args, {**kwargs, "closure": self._closure(closure)}
            i = 1 if args and args[0] is opt else 0  # torch passes (self, *args)
            if len(args) > i and callable(args[i]):
                return (*args[:i], self._closure(args[i]), *args[i + 1:]), kwargs
        except Exception as e:
            self.registry.error("optimizer.pre_hook", e)
        return None

    def _closure(self, closure):
        rec = self.rec

        def run_closure():
            rec.remove(B_OPTIMIZER)
            try:
                return closure()
            finally:
                rec.phase = OPTIMIZER
                rec.push(B_OPTIMIZER)
                try:
                    if self._memory_due(self.step_index + 1):
                        self._mem_static["gradients"] = memory.gradient_bytes(
                            self.adapter.memory_module())
                except Exception as e:
                    self.registry.error("optimizer.closure", e)
        return run_closure

    def _opt_post(self, opt, args, kwargs) -> None:
        t = self._t_opt
        try:
            if t is not None and not self._detail_on:
                now = perf_counter()
                self._t_opt = None
                self._end_lean(now, now - t)
                return
            self._t_opt = None
            if t is not None:  # detail installed in between (cannot happen from hooks)
                self.rec.push(B_OPTIMIZER)
            self.rec.remove(B_OPTIMIZER)
            self._end_step()
        except Exception as e:
            self.registry.error("optimizer.post_hook", e)

    def _memory_due(self, step: int) -> bool:
        return step <= 2 or step % self.cfg.memory_every == 0

    # --- public API ---------------------------------------------------------------------
    def step(self) -> None:
        """End a step by hand (only when no optimizer was given to attach())."""
        if self.optimizer is not None or self._closed:
            return
        try:
            if self._memory_due(self.step_index + 1):
                self._mem_static["gradients"] = memory.gradient_bytes(self.adapter.memory_module())
            self._end_step()
        except Exception as e:
            self.registry.error("monitor.step", e)

    def close(self, interrupted: bool = False) -> None:
        """Undo all instrumentation, close the run log, stop the /metrics server. Called
        while an exception propagates (a `finally:`), it first records where the rank failed
        (a "failed" stall record; the "end" that follows says `"failed": true`): not a clean
        close, so the file_sd target stays and the scrapers are not told of a close.
        `interrupted=True` (or a KeyboardInterrupt propagating: Ctrl-C) is a clean close of
        a run the user stopped: the "end" record says `"interrupted": true`; so is an
        uncaught KeyboardInterrupt at interpreter exit (`_at_exit`). A SIGTERM records a
        "terminated" end before the process ends by it (`_terminated`, signals.py)."""
        self._shutdown(undo=True, exc=sys.exc_info()[1], interrupted=interrupted)

    def _at_exit(self) -> None:
        """Interpreter exit without close(): end the run log and remove the target, unless
        an uncaught exception ended the program (a crash: the log gets the watchdog's record
        of where it failed and no end, and the target stays, so the rank shows as down).
        Instrumentation is left in place: the process is ending, and the process group may
        already be destroyed."""
        if self._closed:
            return
        exc = guards.uncaught_exception()
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C outside a try/finally: a clean stop
            self._shutdown(undo=False, exc=exc)
            return
        if exc is not None:
            self._record_failure(exc)
            self._closed = True
            guards.unregister(self)
            if self._writer is not None:  # every completed step and the failure, no end
                try:
                    self._writer.abandon(timeout=2.0)  # (the writer drains in batches)
                except Exception as e:  # noqa: BLE001 - the process is ending
                    self.registry.error("runlog", e)
            return
        self._shutdown(undo=False)

    def _terminated(self, signum: int, frame) -> None:
        """The SIGTERM handler's recording (signals.py passes the signal on after it): where
        the rank was (a "terminated" stall record, watchdog.py) and an end marked
        `"terminated": true`, written by a helper thread joined for at most TERM_WAIT_S, so a
        lock the interrupted main thread holds (the run log's queue) delays the end of the
        process by that much at most, never blocks it."""
        if self._closed:
            return

        def record() -> None:
            try:
                self.watchdog.stop()
                self.watchdog.signalled(signals.name(signum), frame)
                self._shutdown(undo=False, terminated=True)
            except Exception as e:  # noqa: BLE001 - the process is ending
                self.registry.error("close", e)

        t = threading.Thread(target=record, name="zerodoc-sigterm", daemon=True)
        t.start()
        t.join(TERM_WAIT_S)

    def _record_failure(self, exc: BaseException | None) -> bool:
        """Stop the watchdog; if `exc` ended the training, record where (zerodoc/shim/
        watchdog.py, `failed`) and return True. A `SystemExit(0)` is a clean exit, and so is
        a KeyboardInterrupt (the user stopped the run: see `_shutdown`)."""
        self.watchdog.stop()
        if exc is None or isinstance(exc, KeyboardInterrupt) or \
                (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            return False
        try:
            self.watchdog.failed(exc)
        except Exception as e:
            self.registry.error("watchdog", e)
        return True

    def _shutdown(self, undo: bool, exc: BaseException | None = None,
                  interrupted: bool = False, terminated: bool = False) -> None:
        if self._closed:
            return
        failed = self._record_failure(exc)
        interrupted = not failed and (interrupted or isinstance(exc, KeyboardInterrupt))
        self._closed = True
        guards.unregister(self)
        if getattr(self, "_undo_signal", None) is not None:
            self._undo_signal()  # main thread only (a no-op elsewhere: the handler stays inert)
        try:
            atexit.unregister(self._at_exit)
        except Exception:  # noqa: BLE001
            pass
        if undo:
            self._remove_detail()
        for fn in reversed(self._undo if undo else ()):
            try:
                fn()
            except Exception as e:
                self.registry.error("close", e)
        if self.nvml is not None:
            self.nvml.stop()
        if self._writer is not None:
            try:
                self._writer.close(self.step_index, self.totals, failed=failed,
                                   interrupted=interrupted, terminated=terminated)
            except OSError as e:
                self.registry.error("runlog", e)
        if self._server is not None:
            signal = getattr(self, "close_signal", None)
            # A clean close is shown to the scrapers (bounded, exporter/closing.py) and the
            # file_sd target goes; a failed one is not a close: the target stays, so the rank
            # shows as down (ZerodocExporterDown / ZerodocRunDown) like a killed one.
            if signal is not None and not failed:
                if terminated:  # no linger for the scrapers: the process is ending
                    signal.close(0.0)
                else:
                    signal.close()
            if self._target is not None and not failed:
                try:
                    os.unlink(self._target)
                except FileNotFoundError:
                    pass
                except Exception as e:
                    self.registry.error("file_sd", e)
            try:
                self._server.shutdown()
                self._server.server_close()
            except Exception as e:
                self.registry.error("exporter", e)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._shutdown(undo=True, exc=exc)

    # --- step end ------------------------------------------------------------------
    def flush(self) -> int:
        """Read back the device timings that have finished and fold them into the totals now,
        not at the next step end (no synchronisation: call it after your own, e.g. in a
        benchmark). Returns how many collectives were read. A no-op on CPU."""
        if self._closed or not self.timer.device:
            return 0
        try:
            n = self.timer.collect(step_end=False)
            dev, checks, caught = self.rec.take_device()
            self._fold(dev, self.rec.take_comm(), None, checks, caught)
            return n
        except Exception as e:
            self.registry.error("monitor.flush", e)
            return 0

    def _fold(self, acc: list, comm: dict, host: list | None, checks: int = 0,
              caught: int = 0) -> tuple[list, list, float, list, float]:
        """Fold bucket seconds (`acc`: the device clock on GPU) and collectives into the
        totals; returns the run log's compute and comm rows, the host compute time, the
        framework rows (per unit and phase) and the step's framework time (theirs and that of
        no unit)."""
        tot = self.totals
        slots = self._unit_slots
        if slots is None or len(slots[0]) != 2 * len(self.unit_names):
            slots = self._unit_slots = self._slots()
        slots, fw_slots = slots
        compute_rows = []
        totc = tot.compute
        for b, u, phase, key in slots:
            s = acc[b]
            if s > 0.0:
                compute_rows.append([u, phase, s])
                totc[key] = totc.get(key, 0.0) + s
        framework_rows = []
        totf = tot.unit_framework
        framework_s = acc[B_FRAMEWORK]
        for b, u, phase, key in fw_slots:
            s = acc[b]
            if s > 0.0:
                framework_rows.append([u, phase, s])
                totf[key] = totf.get(key, 0.0) + s
                framework_s += s
        comm_rows = []
        keys = self._comm_keys
        totm = tot.comm
        for k, a in comm.items():
            kk = keys.get(k)
            if kk is None:
                u, p, c = k
                kk = keys[k] = (u, PHASES[p], COLLECTIVES[c],
                                (self.unit_names[u], PHASES[p], COLLECTIVES[c]))
            comm_rows.append([kk[0], kk[1], kk[2], *a])
            t = totm.get(kk[3])
            if t is None:
                totm[kk[3]] = CommTotals(*a)
            else:
                t.add_row(a)
        tot.optimizer_seconds += acc[B_OPTIMIZER]
        tot.framework_seconds += framework_s
        tot.other_seconds += acc[B_OTHER]
        src = host if host is not None else acc
        host_s = sum([src[b] for b, _u, _p, _k in slots])
        tot.host_compute_seconds += host_s
        tot.launch_checks += checks
        tot.launch_caught_up += caught
        self._folds += 1  # last: the exporter rebuilds per-unit families when it changes
        return compute_rows, comm_rows, host_s, framework_rows, framework_s

    def _slots(self) -> tuple[list, list]:
        """(bucket, unit, phase name, totals key) of every unit's forward and backward
        compute, in (unit, phase) order, and of every unit's framework time (forward and
        backward; ZeroRedundancyOptimizer's is the optimizer's): the step end's loops,
        computed once."""
        names = list(enumerate(self.unit_names))
        fw = self.rec.framework_bucket
        phases = (0, 1, 2) if self.adapter.framework == "zero1" else (0, 1)
        return ([(unit_bucket(u, p), u, PHASES[p], (name, PHASES[p]))
                 for u, name in names for p in (0, 1)],
                [(fw(u, p), u, PHASES[p], (name, PHASES[p])) for u, name in names
                 for p in phases])

    def _end_step(self) -> None:
        now = perf_counter()
        if not self._detail_on:
            self._end_lean(now)
            return
        # a detail step from here on (a step without detail ends in `_end_lean`)
        device = self.timer.device
        self.timer.collect()  # CUDA: read back finished events (never blocks)
        acc, comm = self.rec.drain(now, keep_comm=False)
        host = None
        checks = caught = 0
        if device:  # bucket times from the device clock; the host's are launches
            host = acc
            acc, checks, caught = self.rec.take_device()
            self._step_event(self.step_index + 1)
        start = self._step_start if self._step_start is not None else self._t_attach
        step_s = now - start
        self._step_start = now
        self.step_index += 1
        tot = self.totals
        compute_rows, comm_rows, host_s, framework_rows, framework_s = self._fold(
            acc, comm, host, checks, caught)
        tot.detail_steps += 1
        # This step's collectives by kind (on a GPU the rows read back are not all this
        # step's: its count alone, from sequence numbers).
        kinds: dict | None = None if device else {}
        for (_u, _p, c), a in (comm.items() if kinds is not None else ()):
            k = kinds.setdefault(COLLECTIVES[c], [0, 0])
            k[0] += a[0]
            k[1] += a[1]
        start = self.seq.by_name()
        coll = self.seq.step(kinds)
        order = self.order.take(start, self.seq.by_name()) if self.order.items else None

        mem = self._memory(now)
        self_s = self._pending_self_s
        tot.steps += 1
        tot.last_step = self.step_index
        tot.first_step = tot.first_step or self.step_index
        tot.step_seconds += step_s
        tot.last_step_seconds = step_s
        tot.max_step_seconds = max(tot.max_step_seconds, step_s)
        tot.self_seconds += self_s
        tot.memory = mem
        tot.errors = self._errors()
        tot.updated_unix = time.time()
        i = bisect.bisect_left(STEP_BUCKETS, step_s)
        if i < len(self.hist_counts):
            self.hist_counts[i] += 1

        if self._writer is not None:
            rec = {
                "type": "step", "step": self.step_index, "end_unix": tot.updated_unix,
                "detail": True, "step_s": step_s, "optimizer_s": acc[B_OPTIMIZER],
                "self_s": self_s, "compute": compute_rows, "comm": comm_rows, "mem": mem,
                # K in force on every step (not only sampled ones): a sampled step's K goes
                # stale when adaptive K rises after it (readers take the newest)
                "detail_k": self.sampler.k,
                "framework_s": framework_s, "framework": framework_rows,
                "other_s": acc[B_OTHER], "wait_s": acc[B_WAIT],
                "compute_s": sum([r[2] for r in compute_rows]),
                "exposed_s": sum([a[3] for a in comm.values()]),
            }
            if coll is not None:
                rec["coll"] = coll
            if self.seq.last:
                rec["seq"] = self.seq.last
            if host is not None:  # GPU: compute rows are device time; launches kept apart
                rec["host_compute_s"] = host_s
                rec["launch"] = [checks, caught]
                if self._device_step is not None:
                    rec["device_step_s_for"], rec["device_step_s"] = self._device_step
                    self._device_step = None
            if tot.errors:
                rec["errors"] = tot.errors
            try:
                self._write_order(order)
                self._writer.write(rec)  # a hand-over to the writer thread: no file I/O here
                if self._writer.units_due(self.step_index):
                    self._writer.write_units(tot)
            except (OSError, ValueError) as e:
                self.registry.error("runlog", e)
        self._tiers(True, step_s)
        self._pending_self_s = perf_counter() - now
        if self.step_index == 1:
            self._first_step_end()

    def _end_lean(self, now: float, opt_s: float | None = None) -> None:
        """The step end of a step without per-unit detail (the always-on tier): step-level
        numbers only, no dict built here (the run-log writer builds the record from a tuple),
        memory the latest read (`_memory`), nothing per unit. `opt_s`: the optimizer's
        time when the hooks took it without the recorder (`_opt_pre`)."""
        timer = self.timer
        dev = None
        if timer.device:
            # a detail step's tail still to read back (never a wait): asked until it is done
            if self._tail and not self._read_tail():
                self._tail = False
            o = self.rec.drain_step(now, keep_comm=True)
            self._step_event(self.step_index + 1)
            dev, self._device_step = self._device_step, None
        else:
            o = self.rec.drain_step(now, keep_comm=False)
        if opt_s is None:
            opt_s = o
        start = self._step_start if self._step_start is not None else self._t_attach
        step_s = now - start
        self._step_start = now
        self.step_index = step = self.step_index + 1
        seq = self.seq
        coll = None if seq.readers == [] else seq.step(None)  # [] : no process group
        mem = self._mem
        if mem is None or now - self._mem_t >= MEMORY_READ_S or self._memory_due(step) or \
                self.cfg.reset_peak_memory:
            mem = self._memory(now)
        self_s = self._pending_self_s
        tot = self.totals
        tot.optimizer_seconds += opt_s
        tot.steps += 1
        tot.last_step = step
        if not tot.first_step:
            tot.first_step = step
        tot.step_seconds += step_s
        tot.last_step_seconds = step_s
        if step_s > tot.max_step_seconds:
            tot.max_step_seconds = step_s
        tot.self_seconds += self_s
        tot.memory = mem
        if self.registry.n_errors != self._errors_n:
            self._errors()
        tot.errors = errors = self._errors_snap
        tot.updated_unix = end_unix = time.time()
        i = bisect.bisect_left(STEP_BUCKETS, step_s)
        if i < len(self.hist_counts):
            self.hist_counts[i] += 1
        w = self._writer
        if w is not None:
            try:
                if seq.names is not self._order[0]:  # groups made or gone: say their names
                    self._write_order(None)
                w.write_lean_step((step, end_unix, step_s, opt_s, self_s, mem, coll, dev,
                                   errors or None, self.sampler.k, seq.last))
                if w.units_due(step):
                    w.write_units(tot)
            except (OSError, ValueError) as e:
                self.registry.error("runlog", e)
        if self.sampler.mode != "off":
            self._tiers(False, step_s)
        self._pending_self_s = perf_counter() - now
        if step == 1:
            self._first_step_end()

    def _write_order(self, order: dict | None) -> None:
        """A `collorder` record (collorder.py) before this step's, when the group names or
        the order (None: unchanged) differ from the last written."""
        names, last = self._order
        order = last if not order else order
        if (self.seq.names is names or not self.seq.names) and order == last:
            return
        self._order = (self.seq.names, order)
        self._writer.write(collorder.record(self.step_index, self.seq.names, order,
                                            self.unit_names))

    def _read_tail(self) -> bool:
        """GPU, a step without detail: read back what the last detail step left (never a
        wait); False once nothing is left (no step without detail adds to it)."""
        if self.timer.busy():
            self.timer.collect()
            return True
        return False

    def _errors(self) -> dict:
        """The registry's error counts: a new dict when they changed, else the same one (it
        is handed to the writer thread and the exporter, never changed after)."""
        reg = self.registry
        if reg.n_errors != self._errors_n:
            self._errors_n = reg.n_errors
            self._errors_snap = dict(reg.errors)
        return self._errors_snap

    def _tiers(self, detail: bool, step_s: float) -> None:
        """Step end: install or remove the per-unit instrumentation for the next step, and
        feed the sampler the training thread's and the process's CPU time over the step that
        ended (from the end of the previous step end to the end of this one, a removal
        included; an install paid here is counted in the detail step it serves)."""
        sampler = self.sampler
        due = sampler.due(self.step_index + 1)
        if sampler.mode != "adaptive":  # K fixed: no CPU clock to read
            if detail and not due:
                self._remove_detail()
            elif due and not detail:
                self._install_detail()
            return
        if detail and not due:
            self._remove_detail()
        t0 = thread_time()
        p0 = process_time()
        sampler.observe(self.step_index, step_s, t0 - self._cpu_mark + self._cpu_carry,
                        detail, p0 - self._proc_mark + self._proc_carry)
        self._cpu_carry = self._proc_carry = 0.0
        if due and not detail:
            self._install_detail()
            self._cpu_carry = thread_time() - t0
            self._proc_carry = process_time() - p0
            t0 = thread_time()
            p0 = process_time()
        self._cpu_mark = t0
        self._proc_mark = p0

    def _step_event(self, step: int) -> None:
        """GPU, every step: one event on the compute stream at each step boundary; two
        consecutive ones give a step's device time, read back lazily (a `query()`, never a
        wait) at a later step end: the record says which step (`device_step_s_for`).
        Three CUDA calls per step: the record, one query of the previous boundary and, when
        it is complete, one elapsed time (the boundary before it is complete too: one
        stream). When the device fell more than a step behind, the steps whose boundaries
        completed together are not all read: the latest is, the older ones are skipped."""
        try:
            pool = self.rec.pool
            free = pool._free  # EventPool.get / put, inlined (every step)
            ev = free.pop() if free else pool.get()
            pool.record(ev)
            q = self._step_ev
            q.append((step, ev))
            n = len(q)
            if n >= 3:
                s1, e1 = q[-2]
                if e1.query():
                    e0 = q[-3][1]
                    self._device_step = (s1, max(0.0, e0.elapsed_time(e1)) / 1e3)
                    if n == 3:
                        free.append(q.pop(0)[1])
                    else:
                        for _s, e in q[:-2]:
                            free.append(e)
                        del q[:-2]
                elif n > 64:  # the device stopped completing: bound it
                    free.append(q.pop(0)[1])
        except Exception as e:
            self.registry.error("device_step", e)

    def _first_step_checks(self) -> None:
        """Mistakes that show only once the job runs (rank 0, once): a model sharded after
        attach() (its units appear now), an optimizer that no longer holds the model's
        parameters (sharding replaced them after the optimizer was built)."""
        if self.adapter.framework == "none":
            msg = guards.sharded_after_attach(self)
            if msg:
                guards.say(f"zerodoc: warning: {msg.removeprefix('zerodoc: ')}")
        if not self._warned_optimizer:
            msg = guards.optimizer_problem(self.model, self.optimizer, self.adapter.framework)
            if msg:
                guards.say(f"zerodoc: warning: {msg.removeprefix('zerodoc: ')}")

    def _memory(self, now: float) -> dict[str, int]:
        """The memory populations of this step end: re-read on steps 1-2, on the tensor
        walks' steps (`memory_every`) and at most every MEMORY_READ_S seconds otherwise;
        between reads the latest read (a new dict per read, never mutated: the writer thread
        and the exporter hold it). Process RSS, the allocator's stats (one C call building a
        nested dict on a GPU) and NVML are not worth a read per step of a fast job; peaks
        are kept by their sources between reads. With `reset_peak_memory` (per-step peaks,
        the user's choice) every step end reads."""
        step = self.step_index
        if self._mem is not None and now - self._mem_t < MEMORY_READ_S and \
                not self._memory_due(step) and not self.cfg.reset_peak_memory:
            return self._mem
        self._mem_t = now
        st = self._mem_static
        if self._memory_due(step) or "sharded_parameters" not in st:
            st["sharded_parameters"] = memory.parameter_bytes(self.adapter.memory_module())
            if self.optimizer is not None:
                st["optimizer_state"] = memory.optimizer_state_bytes(self.optimizer)
        mem = dict(st)
        mem["process_resident"] = memory.process_resident_bytes()
        peak = memory.process_peak_resident_bytes()
        mem["process_peak_resident"] = peak
        if self.allocator is not None:
            dev = self.allocator.read()
            mem.update(dev)
            # Activations and transient buffers by difference (what the tensor walk misses).
            known = sum(st.get(k, 0) for k in ("sharded_parameters", "gradients",
                                                "optimizer_state"))
            mem["activations_and_buffers"] = max(0, dev["peak_allocated"] - known)
            if self.oom is not None:
                mem["ooms_observed"] = self.oom.count
            if self.nvml is not None:
                mem.update(self.nvml.latest())
            peak = dev["peak_reserved"]
        if self.capacity:
            mem["capacity"] = self.capacity
            mem["headroom"] = self.capacity - peak
        self._mem = mem
        return mem


__all__ = ["attach", "Monitor", "NullMonitor"]
