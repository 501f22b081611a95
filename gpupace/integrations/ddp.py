"""A DDP communication hook that paces every gradient bucket's all-reduce.

    ddp = DistributedDataParallel(model)
    pacer.attach(ddp)                  # registers ddp_comm_hook, after checking the model's group
    ...
    loss.backward(); opt.step(); pacer.step()

Each bucket is one site, in the order DDP launches them. DDP rebuilds its buckets after the
first iteration, so the site layout can change once (inside `warmup_steps`); a step with
another site count keeps what the first sites learnt.

The hook averages as DDP's own reducer does, bit for bit: it multiplies each dense
gradient by 1 / world size (dividing, as torch's `allreduce_hook` does, rounds otherwise
where the world size is not a power of two, and the weights drift apart from DDP's) and
divides a sparse one (an `Embedding(sparse=True)`'s), as the reducer does. The tests train 3
gloo ranks both ways, with and without `gradient_as_bucket_view=True`, and with a sparse
embedding, and find DDP's weights bit for bit. One case differs by a unit in the last place
at such world sizes: with `gradient_as_bucket_view=True` and gradients kept from one backward
to the next (`zero_grad(set_to_none=False)`, accumulation without `no_sync`), the reducer
divides a gradient that is already its bucket's view in place, and multiplies one it copies;
a hook sees the bucket after both and cannot tell them apart.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real types.


import torch
import torch.distributed as dist

from ..pacer import Pacer


class Attached:
    """The hook's state as `Pacer.attach` registers it on one model: its pacer, checked
    against that model's process group. A bucket tells nothing of the group, so the hook
    refuses a pacer registered by hand (one attached to another model included), which
    averaged a subgroup model's gradients over the whole world without a word. `prefix` names
    the model in its sites' names: "" for the pacer's first model ("bucket0"), "model1." for
    its second ("model1.bucket0": a GAN's two models' buckets told apart in the report)."""

    def __init__(self, pacer: Pacer, prefix: str = ""):
        self.pacer, self.prefix = pacer, prefix


def ddp_comm_hook(state: Attached, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if not isinstance(state, Attached):
        raise RuntimeError("gpupace.ddp_comm_hook runs only as registered by "
                           "pacer.attach(ddp_model), which checks that the model reduces over "
                           "the pacer's ranks; for a hook of your own that calls it with the "
                           "state it is given, pacer.attach(ddp_model, hook=your_hook)")
    pacer = state.pacer
    pacer.check_group()  # the division below needs the group's world size
    tensor = bucket.buffer()
    if tensor.is_sparse:  # DDP's reducer divides a sparse gradient, and rounds so
        tensor.div_(pacer.world_size)
    else:
        tensor.mul_(1.0 / pacer.world_size)
    if bucket.is_last():  # a pass that syncs: more than one a step is refused under Join
        pacer._synced[state.prefix] = pacer._synced.get(state.prefix, 0) + 1
    with pacer.collective(f"{state.prefix}bucket{bucket.index()}", async_op=True) as issued:
        work = dist.all_reduce(tensor, group=pacer.group, async_op=True)
        issued(work)
    return work.get_future().then(lambda fut: fut.value()[0])
