"""Every torch internal zerodoc hooks into, named in one place.

Checked on torch 2.13.0 (CPU build, gloo). Public entry points are preferred; where only a
private attribute gives per-unit attribution it is listed here with the versions it was
read on, and every lookup goes through `HookRegistry`, which fails soft: a missing hook
point is reported once (a warning, the run log header, `zerodoc_hook_available{hook}=0`)
and zerodoc exports what still works.

| hook point                          | public? | what for                                  | checked |
|-------------------------------------|---------|-------------------------------------------|---------|
| `torch.distributed.fsdp.FSDPModule` | yes     | find the sharded units (FSDP2)            | 2.13    |
| `FSDPModule._get_fsdp_state()`      | no      | reach a unit's FSDPState                  | 2.13    |
| `FSDPState._fsdp_param_groups`      | no      | the unit's param groups (2.13: a list;    | 2.13    |
|   (`_fsdp_param_group` before)      |         |   older releases: one group or None)      |         |
| `FSDPModule.set_custom_all_gather`  | yes     | per-unit all-gather wrapper (>= 2.8); tried once at attach: where it only sets the param group's `_all_gather_comm` (2.13) a sample's install sets that attribute itself, else it calls the setter | 2.13    |
| `FSDPModule.set_custom_reduce_scatter` | yes  | per-unit reduce-scatter wrapper (>= 2.8), likewise | 2.13    |
| `FSDPParamGroup._all_gather_comm`   | no      | the comm to delegate to; the install (above); fallback install | 2.13    |
| `FSDPParamGroup._reduce_scatter_comm` | no    | same for reduce-scatter                   | 2.13    |
| `FSDPParamGroup.pre_backward`       | no      | backward start of a unit (instance-wrapped); CUDA: its all-gather wait window | 2.13, 2.11 (read) |
| `FSDPParamGroup.post_backward`      | no      | backward end of a unit (instance-wrapped); CUDA: its wait for the previous reduce-scatter | 2.13, 2.11 (read) |
| `FSDPParamGroup._prefetch_unshard` (staticmethod) | no | explicit prefetch booked as framework time, not the current unit's compute (backward prefetch runs after `pre_backward`) | 2.13, 2.11 (run on H100) |
| `FSDPParamGroup.fsdp_params`        | no      | per-unit parameter facts                  | 2.13    |
| `FSDPParamGroup.mesh_info` / `post_forward_mesh_info` | no | group size, reshard_after_forward | 2.13 |
| `FSDPParam._orig_size`, `.param_dtype`, `.orig_dtype`, `.padded_sharded_param_size` | no | unit bytes | 2.13 |
| `_fsdp_collectives.dist` (module global) | no | HSDP all-reduce per unit: a proxy for  | 2.13    |
|   in `torch.distributed.fsdp._fully_shard` |    |   `torch.distributed` in that module only |       |
| `FSDPParamGroup._is_hsdp`           | no      | whether a unit replicates (HSDP)          | 2.13    |
| `FSDPState._auto_reshard_after_forward` | no  | a root keeps its parameters after forward | 2.13    |
|   (absent before: the root never reshards) |  |   unless `reshard_after_forward` was given |         |
| `FSDPState._states_to_forward_prefetch` / `_states_to_backward_prefetch`, `FSDPParamGroup.unshard_async_op` | no | prefetch facts (compare) | 2.13 |
| `dist.Work` subclassing + `Work.get_future()` | yes | exposed time of async all-gathers     | 2.13    |
| `Optimizer.register_step_pre_hook/post_hook` | yes | step boundaries, optimizer time     | 2.13    |
| `nn.Module.register_forward_pre_hook(prepend=)` / `register_forward_hook(prepend=)` | yes | forward compute per unit | 2.13 |
| `nn.Module._forward_pre_hooks` / `_forward_hooks` (OrderedDicts keyed by `RemovableHandle.id`; a prepended hook moved to the front; the side dicts `_forward_pre_hooks_with_kwargs`, `_forward_hooks_with_kwargs`, `_forward_hooks_always_called` hold only hooks registered with those flags) | no | a detail step's install: zerodoc's forward hooks put back under the key torch gave them once (`module_hook_slot`, `detailplan.py`), the order a fresh `register_*` gives; missing: the public `register_*` at every install | 2.13 (run); 2.0-2.12 (read, from copies of their `module.py`, not every release: the same storage since `prepend` came in 2.0); verified at attach on every run |
| `distributed_c10d._world.pg_map` (the process groups) and `ProcessGroup._get_sequence_number_for_group()` | no | step-level collective counts on steps without per-unit detail (`sampling.SeqCounter`: one C call per group and step, ~0.3 us), each step's `seq` (the groups' numbers at its end, by `ProcessGroup.group_name`: a flight-recorder dump's `process_group[0]`), and on detail steps the number before each collective the FSDP2 comm wrappers issue (`collorder.py`: where a dump's stuck collective falls in a unit and phase; it equals the dumps' `collective_seq_id`, 2.13 gloo, checked by tests/test_flightrec_units.py); missing: no `coll` counts on those steps, no `seq` / `collorder` | 2.13 (gloo); NCCL and gloo implement it since 1.9 (read) |
| `distributed_c10d._get_default_store()` and the store's `compare_set` (public on `Store`) | no | the job identity when no launcher names the job (`jobid.py`: one key set by the first rank, read back by all); missing: the launcher's start time, else this process's own | 2.13 (run: TCPStore, HashStore, FileStore, PrefixStore) |
| `DTensor._local_tensor` (else the public `to_local()`) | no | memory walks: a shard's bytes without `to_local()`'s autograd op (~6x faster) | 2.13 |

CUDA (the GPU path, `zerodoc/shim/cuda.py`, `devclock.py`; read from the 2.11 and 2.13
sources: "2.11/2.13 (read)"; on 2026-11-23 `bench/gpu_check.py` exercised these rows on an H100
with torch 2.11 at world size 1, except `reset_peak_memory_stats` and `_record_memory_history`
/ `_dump_snapshot` (opt-in, off) and the torch <= 2.7 stream choice):

| hook point                          | public? | what for                                  | checked |
|-------------------------------------|---------|-------------------------------------------|---------|
| `torch.cuda.Event(enable_timing=True)` `.record()` / `.query()` / `.elapsed_time()` | yes | every device timestamp; `elapsed_time` only after `query()` | 2.11/2.13 (read) |
| `torch._C._cuda_memoryStats(device)` (nested dict: `allocated_bytes`/`reserved_bytes`/`inactive_split_bytes` → `all` → `current`/`peak`, `num_alloc_retries`, `num_ooms`) | no | allocator populations at each step end without `memory_stats()`'s Python flattening; missing or changed: `torch.cuda.memory_stats()` | 2.13 (read), 2.11 (run on H100) |
| `torch._C._cuda_getCurrentStream(device)` (a `(stream_id, device_index, device_type)` tuple), `torch._C._cuda_getDevice()`, `torch._C._CudaEventBase.record(event, stream)` | no | `cuda.fast_record`: an event on the current stream without `torch.cuda.current_stream()` building a `Stream` per call; missing: `Event.record()` | 2.13 (read), 2.11 (run on H100) |
| `Work.get_future().then(cb)` (NCCL: future complete at enqueue, `cb` inline on a pool stream that waited for the collective) | yes | done event of `async_op=True` collectives | 2.11/2.13 (read) |
| ProcessGroupNCCL stream choice (`async_op=False`: current stream since 2.8; `True`: internal stream) and per-communicator ordering | semi (behaviour) | which events bracket a collective; chaining per process group | 2.8-2.13 (read) |
| `torch.cuda.memory_stats()` (`allocated_bytes.all.*`, `reserved_bytes.all.*`, `inactive_split_bytes.all.current`, `num_alloc_retries`, `num_ooms`) | yes | allocator populations | 2.13 |
| `torch.cuda.reset_peak_memory_stats()` | yes | only with `reset_peak_memory=True` | 2.13 |
| `torch._C._cuda_attach_out_of_memory_observer` | no | OOM count / snapshot | 2.13 |
| `torch.cuda.memory._record_memory_history` / `_dump_snapshot` | no | OOM snapshot (`memory_history=True`) | 2.13 |
| FSDP2 `FSDPState._pre_backward` queueing its final callback before `FSDPParamGroup.pre_backward` runs | no (behaviour) | our end-of-backward callback runs after FSDP's | 2.11/2.13 (read) |
| FSDP1 `_runtime_utils._pre_backward_hook` queueing `_post_backward_final_callback` (root) | no (behaviour) | same for FSDP1 | 2.13 |
| `ZeroRedundancyOptimizer._sync_params` | no | ZeRO-1 broadcast exposure window (instance-wrapped, CUDA only) | 2.13 |

The demo worker's test-only `framework_delay_s` (tests/test_framework_totals.py, not the
product) wraps `FSDPParamGroup.pre_forward` (class from `fsdp2_param_group_class()`; 2.13).
`bench/gpu_check.py` (not the product) also relies on `torch.cuda._sleep` and on
`FSDPParamGroup._all_gather_process_group` being a property (2.11/2.13, read) to re-enable
FSDP2's all-gather at world size 1.

The HSDP all-reduce in `_fsdp_collectives.foreach_reduce` is called as `dist.all_reduce`
(no comm object to replace), hence the module-scoped proxy.

FSDP1 (`FullyShardedDataParallel`, `zerodoc/shim/fsdp1.py`):

| hook point                          | public? | what for                                  | checked |
|-------------------------------------|---------|-------------------------------------------|---------|
| `torch.distributed.fsdp.FullyShardedDataParallel` | yes | find the units (isinstance)      | 2.13    |
| `FSDP.module`                       | yes     | the wrapped module (inner forward hooks)  | 2.13    |
| `FSDP.sharding_strategy`, `.backward_prefetch`, `.forward_prefetch`, `.limit_all_gathers`, `.cpu_offload`, `.process_group` | semi (undocumented state attributes) | facts, ZeRO stage | 2.13 |
| `FSDP._handle` (`FlatParamHandle`)  | no      | the unit's flat parameter                 | 2.13    |
| `FSDP._inter_node_pg`, `._use_orig_params` | no | HSDP replicate group size; facts     | 2.13    |
| `FlatParamHandle.flat_param._unpadded_unsharded_size` / `._sharded_size`, `.world_size`, `.process_group`, `.uses_sharded_strategy`, `._orig_param_dtype`, `._fwd_bwd_param_dtype`, `._reduce_dtype` | no | unit bytes, dtypes | 2.13 |
| `FlatParamHandle._all_gather_flat_param` | no | per-unit all-gather (instance-wrapped; on CPU it calls `dist.all_gather`, list form, blocking) | 2.13 |
| `fsdp._runtime_utils._pre_backward_hook` | no | backward start of a unit (module global; bound into a partial at every forward) | 2.13 |
| `fsdp._runtime_utils._post_backward_hook` | no | backward end of a unit (same; re-registered every forward) | 2.13 |
| `fsdp._runtime_utils._reduce_grad` / `_reduce_grad_no_shard` | no | which unit's gradient is reduced (module globals) | 2.13 |
| `fsdp._runtime_utils.dist` (module reference) | no | a proxy timing `reduce_scatter_single` (`reduce_scatter_tensor` before) and `all_reduce` (NO_SHARD; HSDP inter-group) while a known unit is reduced | 2.13 |

ZeRO-1 / DDP (`zerodoc/shim/zero1.py`):

| hook point                          | public? | what for                                  | checked |
|-------------------------------------|---------|-------------------------------------------|---------|
| `torch.nn.parallel.DistributedDataParallel` (`.module`, `.process_group`) | yes | detect, facts | 2.13 |
| `DistributedDataParallel.register_comm_hook` | yes | time each gradient bucket's all-reduce (issue -> future done); shadowed on the instance after ours is in, so a user's later hook runs behind ours (the C++ reducer takes one hook, once) | 2.13 |
| `DistributedDataParallel._comm_hooks` | no    | do not stack on a user's comm hook; a later user's hook replaces ours there (what the Python reducer calls) | 2.13 |
| `DistributedDataParallel._check_comm_hook`, `.logger._set_comm_hook_name` | no | what torch's `register_comm_hook` does for a user's hook, done for the one taken behind ours (skipped where absent) | 2.13 |
| `DistributedDataParallel._register_builtin_comm_hook` | no | shadowed on the instance after ours is in: raises naming zerodoc (a C++ hook cannot run behind ours) | 2.13 |
| `GradBucket.buffer()`               | yes     | bucket bytes                              | 2.13    |
| `Variable._execution_engine.queue_callback` | no (FSDP/DDP use it) | end of backward compute; end of DDP's wait for its buckets (exposed all-reduce) | 2.13 |
| `torch.distributed.optim.ZeroRedundancyOptimizer` (`.optim`) | yes | detect ZeRO-1; the local optimizer | 2.13 |
| `ZeroRedundancyOptimizer._broadcast_params_from_rank` | no | the post-step parameter broadcasts (instance-wrapped) | 2.13 |
| `zero_redundancy_optimizer.dist` (module reference) | no | a proxy timing `broadcast` while a known optimizer broadcasts | 2.13 |
| `ZeroRedundancyOptimizer._overlap_with_ddp` | no | not instrumented (broadcasts run in DDP's hook then) | 2.13 |

DeepSpeed ZeRO 0-3 (`deepspeed.initialize` engines; `zerodoc/shim/deepspeed.py`, the
`deepspeed.comm` backend in `deepspeed_comm.py`, the ZeRO optimizer and its stage-3 parameter
coordinator in `deepspeed_zero.py`), checked on DeepSpeed 0.19.8 with torch 2.13.0 (CPU
accelerator, gloo). `DeepSpeedEngine` is looked up only if the job imported `deepspeed`; every
other point is instance-scoped and undone on close:

| hook point                          | public? | what for                                  | checked |
|-------------------------------------|---------|-------------------------------------------|---------|
| `deepspeed.runtime.engine.DeepSpeedEngine` (`.module`, `.optimizer`, `.dp_world_size`) | yes | detect, units, facts | 0.19.8 |
| `DeepSpeedEngine.zero_optimization_stage()`, `.zero_offload_optimizer()`, `.zero_*()` config getters, `.communication_data_type` | yes | stage, offload, facts extra | 0.19.8 |
| `deepspeed.comm.comm.cdb` (the `TorchBackend` every `deepspeed.comm` call ends in): `all_gather_into_tensor`, `all_gather`, `all_gather_coalesced`, `all_gather_base`, `reduce_scatter_tensor`, `reduce_scatter`, `reduce`, `all_reduce`, `all_reduce_coalesced`, `broadcast` | semi (module global) | every collective DeepSpeed issues (instance-shadowed); the slow link | 0.19.8 |
| `DeepSpeedEngine.backward` | yes | stage 0-2 backward compute (instance-wrapped) | 0.19.8 |
| `DeepSpeedZeroOptimizer.step` / `DeepSpeedZeroOptimizer_Stage3.step` | yes | step boundaries, optimizer time (instance-wrapped: not a torch Optimizer) | 0.19.8 |
| `DeepSpeedZeroOptimizer.reduce_ipg_grads` | no | stage 1/2 gradient bucket work = framework time | 0.19.8 |
| `DeepSpeedZeroOptimizer.copy_grads_in_partition` | no | stage 1/2 offload: gradient copies to the host | 0.19.8 |
| `DeepSpeedZeroOptimizer.grads_in_partition` / `.averaged_gradients` / `.single_partition_of_fp32_groups` / `.bit16_groups_flat` | no | gradient / optimizer memory, post-step gather bytes | 0.19.8 |
| `DeepSpeedZeroOptimizer_Stage3.parameter_offload.get_param_coordinator()` | no | the stage-3 parameter coordinator | 0.19.8 |
| `PartitionedParameterCoordinator.fetch_sub_module` / `.release_sub_module` | no | which module a fetch is for; per-unit compute spans; on CUDA the exposure window (entry: before DeepSpeed's `wait_stream` on its all-gather stream) (instance-wrapped) | 0.19.8 |
| `PartitionedParameterCoordinator.__all_gather_params_` (mangled) | no | attribution by the parameters gathered (prefetches) | 0.19.8 |
| `DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads` (mangled) | no | gradient bucket work = framework time | 0.19.8 |
| `DeepSpeedZeroOptimizer_Stage3._offload_grad_partition_at_boundary` | no | stage 3 offload: gradient copies to the host | 0.19.8 |
| `DeepSpeedZeroOptimizer_Stage3.grad_partitions_flat_buffer` / `.fp32_partitioned_groups_flat` | no | gradient / optimizer memory | 0.19.8 |
| ZeRO-3 parameter attributes `ds_tensor`, `ds_numel`, `ds_persist`, module `_z3_leaf` | no | unit facts, fetch groups, local shards | 0.19.8 |
| `AllGatherCoalescedHandle.wait()` -> the backend's `Work.wait()` | no | exposed time of stage-3 fetches (it waits on the `TimedWork` we return) | 0.19.8 |

Never used: DeepSpeed's comms logger (`deepspeed.comm.comm.timed_op`, `comms_logger`): it
synchronises the device after every op.

Stack points (`STACK_POINTS`, below): functions of the frameworks that are never hooked, only
recognised on a Python stack by module and `co_qualname` (a frame's code, Python >= 3.11; the
bare function name before), so that a stall or a failure on a step without per-unit detail
(no zerodoc wrapper on the stack: the default's usual step) is placed by what the stack shows:
the collective being issued or waited on, the phase. Nothing runs at any step; the watchdog
reads them from a stuck thread's frames or a failure's traceback, and a renamed function only
stops matching (the placement falls back to the unit's frame and "compute").
`stack_points_missing()` says which ones the installed releases lack (a test checks none).

| stack point (module: function)                           | means                     | checked |
|----------------------------------------------------------|---------------------------|---------|
| `fsdp._fully_shard._fsdp_param_group`: `FSDPParamGroup.unshard`, `.wait_for_unshard` | an all-gather issued / waited on (async unshard: the wait is `Work.wait()`, C++, no `torch.distributed` frame) | 2.13 |
| `fsdp._fully_shard._fsdp_param_group`: `FSDPParamGroup.pre_forward` / `.pre_backward` | the framework's hook of a unit, forward / backward | 2.13 |
| `fsdp._fully_shard._fsdp_param_group`: `FSDPParamGroup.post_backward` | a reduce-scatter issued (and the wait for the previous one) | 2.13 |
| `fsdp._fully_shard._fsdp_collectives`: `foreach_all_gather`, `foreach_all_gather_copy_out` / `foreach_reduce` | all-gather / reduce-scatter | 2.13 |
| `fsdp._fully_shard._fsdp_state`: `FSDPState._root_post_backward_final_callback` | end of backward: waits for the last reduce-scatters | 2.13 |
| `fsdp._runtime_utils` (FSDP1): `_unshard`, `_pre_forward_unshard` / `_reduce_grad` / `_reduce_grad_no_shard` | all-gather / reduce-scatter / all-reduce (unit: the frame's `handle`) | 2.13 |
| `fsdp._runtime_utils` (FSDP1): `_pre_forward`, `_pre_backward_hook`, `_post_backward_hook`, `_post_backward_final_callback` | the framework's hooks, forward / backward | 2.13 |
| `fsdp._flat_param` (FSDP1): `FlatParamHandle.unshard`, `._all_gather_flat_param` | all-gather | 2.13 |
| `deepspeed.runtime.zero.partitioned_param_coordinator`: `PartitionedParameterCoordinator.fetch_sub_module` | a stage-3 fetch (all-gather) of the frame's `current_submodule`, phase from its `forward` | 0.19.8 |
| `deepspeed.runtime.zero.partition_parameters`: `AllGatherHandle.wait`, `AllGatherCoalescedHandle.wait` | the wait of a stage-3 all-gather | 0.19.8 |
| `deepspeed.runtime.zero.stage3`: `DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads` | stage-3 gradient reduce-scatter | 0.19.8 |
| `deepspeed.runtime.zero.stage_1_and_2`: `DeepSpeedZeroOptimizer.reduce_ipg_grads`, `.average_tensor` | stage 1/2 gradient reduction | 0.19.8 |
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger("zerodoc")

CHECKED_TORCH_VERSIONS = ("2.13.0",)

_FSDP2 = "torch.distributed.fsdp._fully_shard."
_FSDP1 = "torch.distributed.fsdp."
_DSZ = "deepspeed.runtime.zero."

# (module, function qualname) -> (collective or "", phase or ""): the stack points (table
# above). "" phase: the phase of the stack around it (a `backward` frame or not).
STACK_POINTS: dict[tuple[str, str], tuple[str, str]] = {
    (_FSDP2 + "_fsdp_param_group", "FSDPParamGroup.unshard"): ("all_gather", ""),
    (_FSDP2 + "_fsdp_param_group", "FSDPParamGroup.wait_for_unshard"): ("all_gather", ""),
    (_FSDP2 + "_fsdp_param_group", "FSDPParamGroup.pre_forward"): ("", "forward"),
    (_FSDP2 + "_fsdp_param_group", "FSDPParamGroup.pre_backward"): ("", "backward"),
    (_FSDP2 + "_fsdp_param_group", "FSDPParamGroup.post_backward"):
        ("reduce_scatter", "backward"),
    (_FSDP2 + "_fsdp_collectives", "foreach_all_gather"): ("all_gather", ""),
    (_FSDP2 + "_fsdp_collectives", "foreach_all_gather_copy_out"): ("all_gather", ""),
    (_FSDP2 + "_fsdp_collectives", "foreach_reduce"): ("reduce_scatter", "backward"),
    (_FSDP2 + "_fsdp_state", "FSDPState._root_post_backward_final_callback"):
        ("reduce_scatter", "backward"),
    (_FSDP1 + "_runtime_utils", "_unshard"): ("all_gather", ""),
    (_FSDP1 + "_runtime_utils", "_pre_forward_unshard"): ("all_gather", "forward"),
    (_FSDP1 + "_runtime_utils", "_reduce_grad"): ("reduce_scatter", "backward"),
    (_FSDP1 + "_runtime_utils", "_reduce_grad_no_shard"): ("all_reduce", "backward"),
    (_FSDP1 + "_runtime_utils", "_pre_forward"): ("", "forward"),
    (_FSDP1 + "_runtime_utils", "_pre_backward_hook"): ("", "backward"),
    (_FSDP1 + "_runtime_utils", "_post_backward_hook"): ("", "backward"),
    (_FSDP1 + "_runtime_utils", "_post_backward_final_callback"): ("", "backward"),
    (_FSDP1 + "_flat_param", "FlatParamHandle.unshard"): ("all_gather", ""),
    (_FSDP1 + "_flat_param", "FlatParamHandle._all_gather_flat_param"): ("all_gather", ""),
    (_DSZ + "partitioned_param_coordinator", "PartitionedParameterCoordinator.fetch_sub_module"):
        ("all_gather", ""),
    (_DSZ + "partition_parameters", "AllGatherHandle.wait"): ("all_gather", ""),
    (_DSZ + "partition_parameters", "AllGatherCoalescedHandle.wait"): ("all_gather", ""),
    (_DSZ + "stage3", "DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads"):
        ("reduce_scatter", "backward"),
    (_DSZ + "stage_1_and_2", "DeepSpeedZeroOptimizer.reduce_ipg_grads"):
        ("reduce_scatter", "backward"),
    (_DSZ + "stage_1_and_2", "DeepSpeedZeroOptimizer.average_tensor"):
        ("reduce_scatter", "backward"),
}
# a stack point's frame local naming the unit it works for (beside `self`), and the local
# giving the phase (DeepSpeed's `fetch_sub_module(current_submodule, forward)`)
STACK_UNIT_LOCALS = ("self", "handle", "current_submodule", "state")
STACK_PHASE_LOCAL = "forward"
# modules whose frames are the framework's own code (its hooks), not the model's compute
FRAMEWORK_MODULES = ("torch.distributed.fsdp.", "torch.distributed._composable.fsdp.",
                     "deepspeed.runtime.zero.")


def stack_point(frame) -> tuple[str, str] | None:
    """The (collective, phase) a frame's function stands for (`STACK_POINTS`), or None.
    Python 3.10 has no `co_qualname`: a method is named by its `self`'s class there."""
    code = frame.f_code
    mod = frame.f_globals.get("__name__", "")
    qual = getattr(code, "co_qualname", None)
    if qual is None and code.co_varnames[:1] == ("self",):
        me = frame.f_locals.get("self")
        qual = f"{type(me).__name__}.{code.co_name}" if me is not None else None
    return STACK_POINTS.get((mod, qual or code.co_name)) or STACK_POINTS.get((mod, code.co_name))


def stack_points_missing() -> list[str]:
    """The stack points the installed torch (and DeepSpeed, where the job has it) do not
    have: "module: qualname" each. A module that does not import is skipped (DeepSpeed not
    installed), a function gone from a module that does is listed."""
    import importlib
    import inspect

    out: list[str] = []
    for mod_name, qual in STACK_POINTS:
        try:
            obj = importlib.import_module(mod_name)
        except Exception:  # noqa: BLE001 - not installed: nothing to place
            continue
        for part in qual.split("."):
            if part.startswith("__") and not part.endswith("__"):
                part = f"_{type(obj).__name__ if not inspect.isclass(obj) else obj.__name__}{part}"
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if not any(getattr(getattr(f, "__code__", None), "co_qualname", qual) == qual
                   for f in _wrapped(obj)):
            out.append(f"{mod_name}: {qual}")
    return out


def _wrapped(fn) -> list:
    """`fn` and the functions it wraps (`__wrapped__`, or a closure's function: DeepSpeed's
    `instrument_w_nvtx` keeps no `__wrapped__`), outermost first."""
    out, seen = [], set()
    while fn is not None and id(fn) not in seen and len(out) < 8:
        seen.add(id(fn))
        out.append(fn)
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            cells = getattr(fn, "__closure__", None) or ()
            inner = next((c.cell_contents for c in cells
                          if callable(getattr(c, "cell_contents", None))
                          and hasattr(c.cell_contents, "__code__")), None)
        fn = inner
    return out


class HookRegistry:
    """Records which hook points were found; warns once per missing one. Refinements of a
    hook point's numbers (FSDP2's `_prefetch_unshard`, `cuda.fast_record`) call only
    `missing`: every hook point reported is a `zerodoc_hook_available` series on every rank,
    and the series budget counts those of the default path."""

    def __init__(self) -> None:
        self.status: dict[str, str] = {}  # hook -> "ok" | reason
        self.errors: dict[str, int] = {}  # hook -> errors caught at run time
        self.n_errors = 0  # their sum (the step end copies `errors` only when it changed)

    def ok(self, hook: str) -> None:
        self.status.setdefault(hook, "ok")

    def missing(self, hook: str, reason: str) -> None:
        if self.status.get(hook, "ok") == "ok":
            self.status[hook] = reason
            warnings.warn(f"zerodoc: hook point {hook} unavailable ({reason}); "
                          "the numbers that depend on it are not collected", stacklevel=3)

    def error(self, hook: str, exc: BaseException) -> None:
        """A failure inside zerodoc's own code at run time: counted, logged once."""
        n = self.errors.get(hook, 0)
        self.errors[hook] = n + 1
        self.n_errors += 1
        if n == 0:
            log.warning("zerodoc: error in %s (counted, training continues): %r", hook, exc)


def dtensor_local(t: Any) -> Any:
    """The local shard of a DTensor (its private `_local_tensor`: `to_local()` runs an
    autograd op per tensor); `to_local()` where that attribute is gone; other tensors as is."""
    local = getattr(t, "_local_tensor", None)
    if local is not None:
        return local
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def fsdp2_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule  # public since 2.6
        return FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule  # 2.4 - 2.5
            return FSDPModule
        except ImportError:
            return None


def fsdp2_param_groups(module: Any) -> list[Any]:
    """The FSDPParamGroups of one fully_shard'ed module (empty if it owns no parameters)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)  # 2.13
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)  # <= 2.12
    return [group] if group is not None else []


def fsdp2_root_keeps_params(module: Any) -> bool:
    """Whether FSDP2 keeps a root unit's parameters gathered after forward (no reshard).

    FSDP2's lazy init clears the root's `post_forward_mesh_info` ("the parameters would be
    freed and all-gathered immediately"): in 2.13 unless the user passed
    `reshard_after_forward` explicitly (`FSDPState._auto_reshard_after_forward`); releases
    without that attribute clear it always.
    Before the first forward the root still looks resharded; this says what will happen."""
    state = module._get_fsdp_state()
    auto = getattr(state, "_auto_reshard_after_forward", None)
    return True if auto is None else bool(auto)


def fsdp2_comm_bases() -> tuple[type, type] | tuple[None, None]:
    """The AllGather / ReduceScatter protocol classes, where this torch has them."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
        return AllGather, ReduceScatter
    except ImportError:
        return None, None


def fsdp2_set_unshard_async(model: Any, enabled: bool) -> bool:
    """Async unshard (needed for real overlap on CPU/gloo); private, used by the demo."""
    fn = getattr(model, "_set_unshard_async_op", None)
    if fn is None:
        return False
    fn(enabled)
    return True


def fsdp2_prefetch_facts(modules: list) -> dict | None:
    """How many units prefetch explicitly (forward / backward) and whether unshard is
    asynchronous: facts `zerodoc compare` reads. None when this torch does not say."""
    fwd = bwd = 0
    async_op = False
    try:
        for m in modules:
            st = m._get_fsdp_state()
            fwd += bool(getattr(st, "_states_to_forward_prefetch", None))
            bwd += bool(getattr(st, "_states_to_backward_prefetch", None))
            async_op |= any(getattr(g, "unshard_async_op", False) for g in fsdp2_param_groups(m))
    except AttributeError:
        return None
    return {"forward": fwd, "backward": bwd, "unshard_async": async_op}


def fsdp2_collectives_module():
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives
        return _fsdp_collectives
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import _fsdp_collectives  # 2.4 - 2.5
            return _fsdp_collectives
        except ImportError:
            return None


def fsdp2_param_group_class():
    """`FSDPParamGroup` (its `_prefetch_unshard` is wrapped; see the FSDP2 table)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:
        from torch.distributed._composable.fsdp._fsdp_param_group import (  # 2.4 - 2.5
            FSDPParamGroup,
        )
    return FSDPParamGroup


# --- FSDP1 / DDP / ZeRO-1 (tables above) ----------------------------------------------------


def fsdp1_class() -> type | None:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        return FullyShardedDataParallel
    except ImportError:
        return None


def fsdp1_runtime() -> Any:
    """The module holding FSDP1's backward hooks and gradient reduction (private)."""
    from torch.distributed.fsdp import _runtime_utils
    return _runtime_utils


def ddp_class() -> type | None:
    try:
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel
    except ImportError:
        return None


def zero_optimizer_class() -> type | None:
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer
    except ImportError:
        return None


def zero_optimizer_module() -> Any:
    from torch.distributed.optim import zero_redundancy_optimizer
    return zero_redundancy_optimizer


def process_group_sequence_readers() -> list:
    """The bound `_get_sequence_number_for_group` of every process group in this process
    (`distributed_c10d._world.pg_map`, private); [] before init_process_group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return []
    from torch.distributed.distributed_c10d import _world

    return [pg._get_sequence_number_for_group for pg in list(_world.pg_map)]


def process_group_names() -> list[str]:
    """Each process group's name (`group_name`: what a flight-recorder dump's
    `process_group[0]` says), in `process_group_sequence_readers()`'s order."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return []
    from torch.distributed.distributed_c10d import _world

    return [group_name(pg) for pg in list(_world.pg_map)]


def _group(group: Any) -> Any:
    """`group`, or the default process group for None (what a collective's `group=None`
    means)."""
    if group is None:
        from torch.distributed.distributed_c10d import _get_default_group

        group = _get_default_group()
    return group


def group_name(group: Any) -> str:
    """A process group's name (None: the default group); "" when it has none."""
    return str(getattr(_group(group), "group_name", "") or "")


def sequence_reader(group: Any):
    """The bound `_get_sequence_number_for_group` of `group` (None: the default group), or
    False where the group has none (the per-unit collective order goes unrecorded)."""
    return getattr(_group(group), "_get_sequence_number_for_group", None) or False


def default_store() -> Any:
    """The default process group's c10d store (`distributed_c10d._get_default_store`,
    private); None before init_process_group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def queue_autograd_callback(fn) -> None:
    """Run `fn` when the running backward finishes (valid only inside a backward)."""
    from torch.autograd import Variable
    Variable._execution_engine.queue_callback(fn)


def autograd_callbacks_available() -> bool:
    from torch.autograd import Variable
    return callable(getattr(Variable._execution_engine, "queue_callback", None))


def swap_attr(obj: Any, name: str, new: Any):
    """Set `obj.name = new`; return an undo that restores the old value only while `new` is
    still in place (if another tool wrapped it since, ours stays and must pass through)."""
    old = getattr(obj, name)
    setattr(obj, name, new)

    def undo() -> None:
        if getattr(obj, name, None) is new:
            setattr(obj, name, old)
    return undo


def module_hook_slot(module: Any, fn: Any, *, post: bool, prepend: bool):
    """Where torch keeps `fn` as a forward (pre-)hook of `module`: (the hook dict, its key).

    Registers `fn` once through the public API, finds it in the module's private hook dict
    (`_forward_hooks` / `_forward_pre_hooks`: an OrderedDict keyed by `RemovableHandle.id`,
    a prepended hook first; torch 2.0-2.13), then removes it again. A detail step's install
    puts `fn` back under that key (`detailplan.DetailPlan`). None when the hook is not there,
    the dict cannot move a key to the front, or the hook needs one of the side dicts
    (`_forward_hooks_with_kwargs`, `_forward_hooks_always_called`,
    `_forward_pre_hooks_with_kwargs`: never used by zerodoc's hooks)."""
    register = module.register_forward_hook if post else module.register_forward_pre_hook
    handle = register(fn, prepend=prepend)
    try:
        d = module.__dict__.get("_forward_hooks" if post else "_forward_pre_hooks")
        key = getattr(handle, "id", None)
        if d is None or key is None or d.get(key) is not fn or \
                not callable(getattr(d, "move_to_end", None)):
            return None
        if prepend and next(iter(d)) != key:
            return None
        sides = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called") if post else \
            ("_forward_pre_hooks_with_kwargs",)
        if any(key in module.__dict__.get(side, ()) for side in sides):
            return None
        return d, key
    finally:
        handle.remove()
