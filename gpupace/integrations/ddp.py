"""A DDP communication hook that paces every gradient bucket's all-reduce.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(pacer, gpupace.ddp_comm_hook)     # or pacer.attach(ddp)
    ...
    loss.backward(); opt.step(); pacer.step()

Each bucket is one site, in the order DDP launches them. DDP rebuilds its buckets after the
first iteration, so the site layout can change once (inside `warmup_steps`); a step with
another site count keeps what the first sites learnt.

The hook averages as DDP's own reducer does, bit for bit: it multiplies each dense
gradient by 1 / world size (dividing, as torch's `allreduce_hook` does, rounds otherwise
where the world size is not a power of two: 7e-9 apart after a few steps at 3 ranks) and
divides a sparse one (an `Embedding(sparse=True)`'s), as the reducer does. The tests train 3
gloo ranks both ways, with and without `gradient_as_bucket_view=True`, and with a sparse
embedding, and find DDP's weights bit for bit.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real types.


import torch
import torch.distributed as dist

from ..pacer import Pacer


def ddp_comm_hook(pacer: Pacer, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    pacer.check_group()  # the division below needs the group's world size
    pacer._hooked = True  # for its join hook: the rank's steps follow the passes that sync
    tensor = bucket.buffer()
    if tensor.is_sparse:  # DDP's reducer divides a sparse gradient, and rounds so
        tensor.div_(pacer.world_size)
    else:
        tensor.mul_(1.0 / pacer.world_size)
    with pacer.collective(f"bucket{bucket.index()}", async_op=True) as issued:
        work = dist.all_reduce(tensor, group=pacer.group, async_op=True)
        issued(work)
    return work.get_future().then(lambda fut: fut.value()[0])
