"""GPU and interconnect specs the study models read (public datasheet figures).

Figures are per GPU: dense BF16 tensor throughput (no sparsity), HBM capacity and bandwidth,
NVLink bandwidth per direction, SM count, and the scale-out network bandwidth one GPU gets
(DGX/HGX-style nodes with one NIC per GPU; A40 servers with a 100 Gb/s NIC shared by 8 GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """One GPU model and the links around it.

    Attributes:
        name: Marketing name, e.g. ``"H100"``.
        tflops: Dense BF16 tensor TFLOP/s.
        memory_gb: HBM/GDDR capacity in GB (10^9 bytes).
        hbm_tbs: Memory bandwidth in TB/s.
        nvlink_gbs: Intra-node GPU-to-GPU bandwidth per direction in GB/s (PCIe for A40).
        network_gbs: Inter-node bandwidth per GPU in GB/s.
        sms: Streaming multiprocessors.
    """

    name: str
    tflops: float
    memory_gb: float
    hbm_tbs: float
    nvlink_gbs: float
    network_gbs: float
    sms: int


GPUS: dict[str, GPU] = {
    # H100 SXM5: 989 TFLOP/s BF16 dense, 80 GB HBM3 at 3.35 TB/s, NVLink4 900 GB/s bidirectional,
    # 8x 400 Gb/s ConnectX-7 per DGX H100 node.
    "H100": GPU("H100", 989.0, 80.0, 3.35, 450.0, 50.0, 132),
    # H200 SXM: same compute as H100, 141 GB HBM3e at 4.8 TB/s.
    "H200": GPU("H200", 989.0, 141.0, 4.8, 450.0, 50.0, 132),
    # A100 SXM4 80 GB: 312 TFLOP/s BF16, 2.04 TB/s, NVLink3 600 GB/s bidirectional,
    # 8x 200 Gb/s HDR per DGX A100 node.
    "A100": GPU("A100", 312.0, 80.0, 2.04, 300.0, 25.0, 108),
    # A40: 149.7 TFLOP/s BF16 dense, 48 GB GDDR6 at 696 GB/s, PCIe Gen4 x16 (no NVSwitch),
    # 100 Gb/s Ethernet per 8-GPU server.
    "A40": GPU("A40", 149.7, 48.0, 0.696, 25.0, 1.5625, 84),
}

GPUS_PER_NODE = 8


def gpu_spec(name: str) -> GPU:
    """The spec of ``name``; raises ValueError naming the ``gpu`` option if unknown."""
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {name!r}") from None
