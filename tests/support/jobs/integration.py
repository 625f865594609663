"""One rank of a trainer-integration test job.

    python -m tests.support.jobs.integration SPEC_JSON

Started by tests/test_integrations.py through `zerodoc.demo.launch.Job` (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT set). Each scenario trains a tiny model with the real framework
(Hugging Face Trainer, Accelerate, Lightning) and the zerodoc integration as a user would
write it, and writes `<out>/rank-N.json` with what the test compares zerodoc's run log against,
all of it obtained independently of zerodoc:

- `expected`: per unit, the bytes one all-gather must move, computed from the *original*
  model's parameter sizes (FSDP2 pads dim 0 of every parameter to a multiple of the world);
- `witness`: per step, the count and bytes of every all-gather / reduce-scatter / all-reduce
  that reached `torch.distributed` (wrappers installed beneath FSDP and DDP, i.e. beneath
  zerodoc's interception), with steps cut at the framework's own step-end event;
- `global_step`: the framework's own step counter at the end; `targets_during`: the file_sd
  targets present in the run directory during training.

On a machine without CUDA, Accelerate (and so the HF Trainer) selects FSDP only for
accelerator devices and silently trains DDP instead; `force_fsdp_plugin_on_cpu()` applies,
for the CPU case, exactly the assignment Accelerate makes on a GPU, so that its own FSDP2
preparation runs on gloo. With CUDA nothing is patched.
"""

from __future__ import annotations

import json
import os
import sys

CUDA = False  # set in main()


# --- the witness: collectives counted beneath FSDP / DDP ------------------------------------

# torch.distributed function -> (kind, position and keyword names of the tensor whose bytes
# the collective moves: the gathered output, the reduce-scattered input, the reduced tensor)
_COLLECTIVES = {
    "all_gather_single": ("all_gather", 0, ("output_tensor", "output")),
    "all_gather_into_tensor": ("all_gather", 0, ("output_tensor",)),
    "reduce_scatter_single": ("reduce_scatter", 1, ("input", "input_tensor")),
    "reduce_scatter_tensor": ("reduce_scatter", 1, ("input",)),
    "all_reduce": ("all_reduce", 0, ("tensor",)),
}


class Witness:
    def __init__(self):
        self.active = False
        self.current: dict[str, list[int]] = {}
        self.steps: list[dict[str, list[int]]] = []
        self.targets_during: list[str] | None = None
        self.run_dir = ""

    def install(self) -> "Witness":
        import torch.distributed as dist

        for name, (kind, idx, keys) in _COLLECTIVES.items():
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(real, kind, idx, keys))
        return self

    def _wrap(self, real, kind: str, idx: int, keys: tuple):
        def counted(*args, **kwargs):
            if self.active:
                t = args[idx] if len(args) > idx else next(
                    (kwargs[k] for k in keys if k in kwargs), None)
                nbytes = t.numel() * t.element_size() if t is not None else -10**12
                c = self.current.setdefault(kind, [0, 0])
                c[0] += 1
                c[1] += nbytes
            return real(*args, **kwargs)
        return counted

    def start(self) -> None:
        self.active, self.current = True, {}

    def step_end(self) -> None:
        self.steps.append(self.current)
        self.current = {}
        if self.targets_during is None:
            d = os.path.join(self.run_dir, "file_sd")
            self.targets_during = sorted(os.listdir(d)) if os.path.isdir(d) else []


# --- expected bytes from the model's parameter sizes ----------------------------------------

def expected_gather_bytes(model, units: dict[str, list[str]], world: int,
                          itemsize: int = 4) -> dict:
    """Bytes of one all-gather per FSDP2 unit: every parameter the unit's modules own (not
    owned by a deeper unit), dim 0 padded to a multiple of the world size. `units` maps a
    unit name to its module paths ("" = the root)."""
    owner_of = {path: unit for unit, paths in units.items() for path in paths}
    out = dict.fromkeys(units, 0)
    for name, p in model.named_parameters():  # tied parameters appear once
        owner = max((m for m in owner_of if m == "" or name.startswith(m + ".")), key=len)
        d0 = p.shape[0] if p.dim() else 1
        rest = p.numel() // d0 if d0 else 0
        out[owner_of[owner]] += -(-d0 // world) * world * rest * itemsize
    return out


def fsdp_units(*paths: str) -> dict[str, list[str]]:
    return {(p or "(root)"): [p] for p in paths}


def param_bytes(model, itemsize: int = 4) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad) * itemsize


# --- tiny models -----------------------------------------------------------------------------

def tiny_modules():
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc = nn.Linear(d, d)  # d odd: FSDP2 pads dim 0

        def forward(self, x):
            return torch.relu(self.fc(x))

    class Tiny(nn.Module):
        def __init__(self, d_in=8, d=17, blocks=2):
            super().__init__()
            self.inp = nn.Linear(d_in, d)
            self.blocks = nn.ModuleList([Block(d) for _ in range(blocks)])
            self.out = nn.Linear(d, 3)

        def forward(self, x):
            x = self.inp(x)
            for b in self.blocks:
                x = b(x)
            return self.out(x)
    return Block, Tiny


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=16,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


class TokenData:
    def __init__(self, n=256, seq=16, vocab=128):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids}


# --- CPU: let Accelerate's FSDP plugin through ----------------------------------------------

def force_fsdp_plugin_on_cpu() -> None:
    """accelerate/state.py (AcceleratorState.__init__) sets `distributed_type = FSDP` only in
    its branch for MULTI_GPU / NPU / XPU / ... devices; for MULTI_CPU the plugin is dropped and
    prepare() wraps DDP. Make the same assignments for MULTI_CPU (CPU-only test machines)."""
    from accelerate import state as st
    from accelerate.utils import DistributedType

    original = st.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            st.PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    st.AcceleratorState.__init__ = init


# --- scenarios --------------------------------------------------------------------------------

def hf(spec: dict, w: Witness) -> dict:
    """transformers.Trainer; FSDP2 through its fsdp_config, or the Trainer's default (DDP)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from zerodoc.integrations.hf import ZerodocCallback

    fsdp = spec.get("fsdp", True)
    model = tiny_gpt2()
    world = int(os.environ["WORLD_SIZE"])
    # Accelerate's FSDP2 preparation: the blocks (wrap policy), one group for the tied
    # embedding + final norm + head, the root.
    units = {**fsdp_units("", "transformer.h.0", "transformer.h.1"),
             "transformer.wte+transformer.ln_f+lm_head":
                 ["transformer.wte", "transformer.ln_f", "lm_head"]}
    result = {"expected": expected_gather_bytes(model, units, world),
              "param_bytes": param_bytes(model)}
    kw = {}
    if fsdp:
        kw = {"fsdp": True, "fsdp_config": {"fsdp_version": 2,
                                            "transformer_layer_cls_to_wrap": ["GPT2Block"]}}
        if not CUDA:
            force_fsdp_plugin_on_cpu()
    args = TrainingArguments(output_dir=os.path.join(spec["out"], "hf"), max_steps=spec["steps"],
                             per_device_train_batch_size=2, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, use_cpu=not CUDA,
                             dataloader_num_workers=0, **kw)

    class WitnessCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            result["model_seen"] = type(model).__name__
            w.start()

        def on_step_end(self, args, state, control, **kwargs):
            w.step_end()

    trainer = Trainer(model=model, args=args, train_dataset=TokenData())
    trainer.add_callback(ZerodocCallback(trainer, run_dir=spec["run_dir"], port=0))
    trainer.add_callback(WitnessCallback())
    result["fsdp_enabled"] = bool(trainer.is_fsdp_enabled)
    trainer.train()
    result["global_step"] = trainer.state.global_step
    return result


def accelerate_loop(spec: dict, w: Witness) -> dict:
    """A hand-written Accelerate loop, FSDP2 plugin, gradient accumulation over 2 batches."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    import zerodoc.integrations.accelerate as zd_accelerate

    Block, Tiny = tiny_modules()
    torch.manual_seed(0)
    model = Tiny()
    world = int(os.environ["WORLD_SIZE"])
    result = {"expected": expected_gather_bytes(model, fsdp_units("", "blocks.0", "blocks.1"),
                                               world)}
    if not CUDA:
        force_fsdp_plugin_on_cpu()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"])
    accum = spec.get("accumulate", 2)
    acc = Accelerator(fsdp_plugin=plugin, cpu=not CUDA, gradient_accumulation_steps=accum)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    result["optimizer_type"] = type(optimizer).__name__
    monitor = zd_accelerate.attach(acc, run_dir=spec["run_dir"], port=0)
    w.start()
    micro = 0
    try:
        for _ in range(spec["steps"]):
            for _ in range(accum):
                x = torch.randn(4, 8, device=acc.device)
                with acc.accumulate(model):
                    loss = model(x).square().mean()
                    acc.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                micro += 1
            w.step_end()
    finally:
        monitor.close()
    result["global_step"] = micro // accum
    return result


def lightning_fit(spec: dict, w: Witness) -> dict:
    """lightning.pytorch.Trainer with ModelParallelStrategy (FSDP2 in configure_model), or
    FSDPStrategy (FSDP1, CUDA only); optionally a training_step that raises."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from zerodoc.integrations.lightning import ZerodocCallback

    Block, Tiny = tiny_modules()
    world = int(os.environ["WORLD_SIZE"])
    strategy_name = spec.get("strategy", "model_parallel")
    raise_at = spec.get("raise_at")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = Tiny()

        def forward(self, x):  # FSDP2's hooks run on forward(): call self(...), not self.net
            return self.net(x)

        def training_step(self, batch, i):
            if raise_at is not None and i == raise_at:
                raise RuntimeError("boom at batch %d" % i)
            return self(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def configure_model(self):
            if strategy_name != "model_parallel":
                return
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for b in self.net.blocks:
                fully_shard(b, mesh=mesh)
            fully_shard(self, mesh=mesh)

    module = Module()
    units = fsdp_units("", "net.blocks.0", "net.blocks.1")
    result = {"expected": expected_gather_bytes(module, units, world)}

    class WitnessCallback(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            result["model_seen"] = type(trainer.strategy.model).__name__
            w.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            w.step_end()

    if strategy_name == "model_parallel":
        strategy = ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)
    else:
        strategy = FSDPStrategy(auto_wrap_policy={Block})
    data = TensorDataset(torch.randn(256, 8))
    trainer = pl.Trainer(accelerator="gpu" if CUDA else "cpu", devices=world, strategy=strategy,
                         max_steps=spec["steps"], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[ZerodocCallback(run_dir=spec["run_dir"], port=0),
                                    WitnessCallback()])
    try:
        trainer.fit(module, DataLoader(data, batch_size=4))
    except RuntimeError as e:
        result["raised"] = str(e)
    result["global_step"] = trainer.global_step
    return result


def torchtitan_parts(spec: dict, w: Witness) -> dict:
    """torchtitan's own FSDP2 wrapping (`apply_fsdp_to_decoder`) of its llama3 debug model and
    its `OptimizersContainer`, attached as docs/integrations.md wires them. No forward pass:
    torchtitan's language models train only with FlexAttention / varlen attention, and
    FlexAttention has no backward on CPU (see docs/integrations.md)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.models.llama3 import model_registry

    import zerodoc

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    with torch.device("meta"):
        model = model_registry("debugmodel").model.build()
    n = len(model.layers)
    units = {**fsdp_units("", "tok_embeddings", *[f"layers.{i}" for i in range(n)]),
             "norm+lm_head": ["norm", "lm_head"]}
    result = {"expected": expected_gather_bytes(model, units, world)}
    apply_fsdp_to_decoder(model, init_device_mesh("cpu", (world,)), param_dtype=torch.float32,
                          reduce_dtype=torch.float32, pp_enabled=False)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    monitor = zerodoc.attach(model, optimizers, run_dir=spec["run_dir"], port=0)
    w.start()
    for _ in range(spec["steps"]):
        optimizers.step()  # the container steps its AdamWs; its own step hooks run once
        w.step_end()
    monitor.close()
    result["global_step"] = spec["steps"]
    return result


SCENARIOS = {"hf": hf, "accelerate": accelerate_loop, "lightning": lightning_fit,
             "torchtitan": torchtitan_parts}


def main() -> None:
    global CUDA
    spec = json.loads(sys.argv[1])
    import torch

    CUDA = torch.cuda.is_available()
    if CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    w = Witness().install()
    w.run_dir = spec["run_dir"]
    result = SCENARIOS[spec["scenario"]](spec, w)
    result.update(witness=w.steps, targets_during=w.targets_during, cuda=CUDA)
    rank = int(os.environ["RANK"])
    os.makedirs(spec["out"], exist_ok=True)
    with open(os.path.join(spec["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo ranks that exit at different times can abort at interpreter exit: leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
