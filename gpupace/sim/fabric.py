"""The fabric: time of one bucket's all-reduce on a hierarchical, oversubscribed network.

Hierarchical all-reduce (what NCCL does across nodes): reduce-scatter inside the node over
NVLink, an all-reduce of 1/g of the bucket between nodes (one NIC rail per GPU), an
all-gather inside the node. Bandwidth terms follow the ring algorithm's 2 (n - 1) / n bytes
per byte reduced; latency terms follow a tree between nodes (2 log2 n steps), as NCCL uses
at scale. Traffic between leaves crosses the spine at 1 / oversubscription of the NIC rate.

Contention: each switch the job's traffic crosses (its leaves, plus the spine when there
are several leaves) carries a time-varying load from other traffic, log-normal around
`contention_mean`, correlated from step to step (AR(1)). A collective runs at the pace of its
most loaded switch, so the more switches a job spans, the worse its typical step.
"""

from __future__ import annotations

import math

import numpy as np

from .scenario import Scenario


def bucket_sizes_mb(sc: Scenario) -> np.ndarray:
    """Bucket sizes in MB: full buckets and a smaller last one, as DDP fills them."""
    nb = sc.buckets
    sizes = np.full(nb, sc.bucket_mb)
    sizes[-1] = sc.grad_mb - sc.bucket_mb * (nb - 1)
    return sizes


def n_switches(sc: Scenario) -> int:
    """Switches the job's inter-node traffic crosses: its leaves, and the spine if > 1 leaf."""
    if sc.nodes == 1:
        return 0
    return sc.leaves + (1 if sc.leaves > 1 else 0)


def base_transfer_us(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket: (time of the intra-node part, time of the inter-node part at no contention)."""
    g, n = sc.gpus_per_node, sc.nodes
    mb = bucket_sizes_mb(sc) * 1e6  # bytes
    nvlink = sc.nvlink_gbs * 1e3 * sc.link_efficiency  # bytes per us
    intra = 2.0 * (g - 1) / g * mb / nvlink + sc.hop_latency_us * 2 * (g - 1)
    if n == 1:
        return intra, np.zeros_like(mb)
    nic = sc.nic_gbps * 1e9 / 8 / 1e6 * sc.link_efficiency  # bytes per us per rail
    if sc.leaves > 1:
        nic /= sc.oversubscription
    inter = 2.0 * (n - 1) / n * (mb / g) / nic + sc.hop_latency_us * 2 * math.ceil(math.log2(n))
    return intra, inter


def contention_factor(sc: Scenario, z: np.ndarray) -> np.ndarray:
    """Slowdown of inter-node transfer per step, 1 + the load of the most loaded switch, from
    standard-normal AR(1) states z [steps, switches]."""
    if z.shape[1] == 0 or sc.contention_mean == 0.0:
        return np.ones(z.shape[0])
    sig = sc.contention_sigma
    load = sc.contention_mean * np.exp(sig * z - 0.5 * sig * sig)  # mean contention_mean
    return 1.0 + load.max(axis=1)
