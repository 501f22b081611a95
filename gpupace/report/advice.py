"""The suggested action for each failure mode, worded for the run's collective backend: a
CPU (gloo) run gets no advice about GPUs, NICs or NCCL, and one rank is "rank 3", not
"ranks 3"."""

from __future__ import annotations

ACTIONS = {
    # Not "pace the early ranks": the policy delays a rank only once it has been early for a
    # holdoff, so a late rank that changes every step gets no delay (the simulator's
    # amplification preset: delays on 0% of the steps, +0.0% throughput).
    "sync_amplification": "a different rank is late each step and every rank waits for it; no "
    "delay can be planned for ranks late in turn or at random (gpupace delays only ranks that "
    "are steadily early). Find what stalls single ranks (data loading, garbage collection, OS "
    "noise, throttling) and synchronise less often (larger DDP buckets, gradient accumulation "
    "with no_sync)",
    # Not one of the four modes: what sync_amplification's finding says when late spells
    # (`ranks.late_spells`) make most of its time.
    "late_spells": "{ranks} late for spells of the run (steps in the evidence), not all of it, "
    "so not placement, which stays put: look at what else ran on the machines in those steps (data "
    "loading, checkpoint writes, other processes, thermal or power capping, a degraded link)",
    # Timing alone cannot tell placement from a rank given more work, or a slower GPU: both
    # are steadily late (the demo's persistent straggler is more work, and reads locality).
    "locality": "fix placement: check the GPU-to-NIC and NUMA affinity of {ranks} "
    "(nvidia-smi topo -m), bind them to their near NIC and CPU socket, or move them; where "
    "placement is right, check whether {their} work or data is uneven (longer sequences, a "
    "larger shard) or {their} GPU slower (clocks, throttling: nvidia-smi -q -d PERFORMANCE)",
    "fabric_contention": "look at the topology: congested links or switches (oversubscribed "
    "uplinks, other jobs on the same leaf); topology-aware placement, NCCL algorithm/channel "
    "tuning",
    "runtime_jitter": "find the noisy service: heavy-tailed stalls or regime switches come from "
    "the runtime (OS daemons, allocator, kernel launches, data loading); isolate cores, "
    "pre-allocate memory, capture CUDA graphs",
}
# The same advice where the run's collectives ran on CPUs (gloo): no GPU, NIC or NCCL.
CPU_ACTIONS = {
    "locality": "{ranks} steadily late on a CPU ({backend}) run: check what differs there: "
    "uneven work or data, other processes on {their} cores, NUMA placement (pin each rank to "
    "its own cores: taskset, numactl --cpunodebind)",
    "fabric_contention": "look at the network between the hosts (or, on one host, the "
    "loopback and memory bandwidth the ranks share): other traffic, oversubscribed links",
    "runtime_jitter": "find the noisy service: heavy-tailed stalls or regime switches come from "
    "the runtime (OS daemons, allocator, data loading, other processes); isolate cores, "
    "pre-allocate memory",
}
# Locality whose late ranks are every GPU of some nodes: the host, not a GPU's placement.
LATE_NODE = ("{nodes} late as a whole ({ranks}: every GPU of {it}), which points at the host, "
             "not at a GPU's placement: check {it} for a degraded NIC or link (error counters, "
             "ibstat), thermal or power throttling (nvidia-smi -q -d PERFORMANCE) and other jobs "
             "on {it}")
LATE_NODE_CPU = ("{nodes} late as a whole ({ranks}: every rank of {it}), which points at the "
                 "host: check {it} for other processes, a lower CPU frequency (throttling, power "
                 "settings) and its network link")
UNKNOWN_BACKEND_LOCALITY = (
    "{ranks} steadily late: check {their} placement (GPU runs: GPU-to-NIC and NUMA affinity, "
    "nvidia-smi topo -m; CPU runs: core pinning and other processes on {their} cores) and "
    "whether {their} work is uneven")


def _named(word: str, items: list[int]) -> str:
    """'<word> 3', or '<word>s 1, 2, 5' (the first 8, then '...'), in the order given."""
    shown = ", ".join(map(str, items[:8])) + (" ..." if len(items) > 8 else "")
    return f"{word} {shown}" if len(items) == 1 else f"{word}s {shown}"


def node_names(nodes: list[int]) -> str:
    """'node 1', or 'nodes 0, 3' (the first 8, then '...')."""
    return _named("node", nodes)


def rank_names(ranks: list[int]) -> str:
    """'rank 3', or 'ranks 1, 2, 5' (the first 8, then '...'), in the order given."""
    return _named("rank", ranks)


def action(mode: str, ranks: list[int], backend: str = "", nodes: list[int] = ()) -> str:
    """The suggested action, worded for the run's collective backend ("nccl", "gloo", "mpi",
    "sim" or "" when the telemetry does not say); for locality whose late ranks are whole
    `nodes`, the host's."""
    named = rank_names(ranks) if ranks else "the late ranks (none named)"
    their = "its" if len(ranks) == 1 else "their"
    if mode == "locality" and nodes:
        it = "it" if len(nodes) == 1 else "them"
        host = LATE_NODE_CPU if backend == "gloo" else LATE_NODE
        return host.format(nodes=node_names(nodes), it=it, ranks=named)
    if backend == "gloo" and mode in CPU_ACTIONS:
        text = CPU_ACTIONS[mode]
    elif backend in ("", "unknown") and mode == "locality":
        text = UNKNOWN_BACKEND_LOCALITY
    else:
        text = ACTIONS[mode]
    return text.format(ranks=named, their=their, backend=backend)
