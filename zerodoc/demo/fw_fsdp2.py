"""Demo builder: FSDP2 (`fully_shard`), 1-D mesh, or a 2-D HSDP mesh with `hsdp_replicas`."""

from __future__ import annotations

import torch

from .frameworks import Built, standard
from .transformer import build as build_model


def build(cfg, spec: dict) -> Built:
    mesh = None
    replicas = int(spec.get("hsdp_replicas", 1))
    if replicas > 1:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        ws = dist.get_world_size()
        if ws % replicas:
            raise ValueError(f"world size {ws} is not a multiple of hsdp_replicas={replicas}")
        mesh = init_device_mesh("cpu", (replicas, ws // replicas),
                                mesh_dim_names=("replicate", "shard"))
    model = build_model(cfg, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.get("lr", 1e-3))
    return standard(model, opt)
