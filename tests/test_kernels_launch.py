"""`kernels.launch.Hot`: what its direct launches hand Triton's launcher, against what the
installed Triton's own runner (`CompiledKernel.__getitem__`) hands it for the same call.

A launch needs a GPU; the argument plumbing does not. The compiled kernel here is a stand-in
that records what its launcher `run` receives, and the runner is Triton's own code run on it,
so a Triton that changed its launcher's convention fails this test. On a GPU the engine's
tests check that the direct launches compute what the JIT's do (tests/gpu)."""

import pytest
import torch
import triton

from gpupace.kernels import launch

pytestmark = pytest.mark.timeout(60)


class CudaBuffer:
    """Stands for a CUDA tensor: a device and a data pointer."""

    def __init__(self, ptr: int):
        self.device = torch.device("cuda", 0)
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class Compiled:
    """A compiled kernel's launcher interface, recording each launch."""

    function, packed_metadata, module, name, src = 0xF00, ("packed",), "loaded", "k", None

    def __init__(self):
        self.launches = []

    def run(self, *args):
        self.launches.append(args)

    def _init_handles(self):
        pass

    # Triton's own code, run on this stand-in
    __getitem__ = triton.compiler.CompiledKernel.__getitem__
    launch_metadata = triton.compiler.CompiledKernel.launch_metadata


class Kernel:
    """A JIT function: `kernel[grid](*args, **meta)` returns the compiled kernel and counts."""

    def __init__(self):
        self.compiled, self.jit_calls = Compiled(), []

    def __getitem__(self, grid):
        def call(*args, **meta):
            self.jit_calls.append((grid, args, meta))
            return self.compiled
        return call


@pytest.fixture
def stream(monkeypatch):
    monkeypatch.setattr(launch, "current_stream", lambda device: 4242)
    return 4242


def triton_runner_args(compiled, grid, args, stream):
    """What the installed Triton's runner passes to `run` for this call."""
    compiled.launches.clear()
    compiled[grid](*args, stream=stream)
    return compiled.launches.pop()


def test_direct_launches_pass_what_tritons_runner_passes_with_pointers_as_integers(stream):
    kernel = Kernel()
    a, b = CudaBuffer(0x7000), CudaBuffer(0x9000)
    hot = launch.Hot(kernel, (1,), [a, b, 0, 2.5, True], free=2, meta={"num_warps": 1})
    hot(3)  # the first call goes through the JIT, with the tensors
    assert kernel.jit_calls == [((1,), (a, b, 3, 2.5, True), {"num_warps": 1})]
    assert hot.direct and hot.path == "run" and not kernel.compiled.launches
    hot(5)
    hot(6)
    assert len(kernel.jit_calls) == 1  # later calls skip the JIT
    got = list(kernel.compiled.launches)
    want = triton_runner_args(kernel.compiled, (1, 1, 1), [a, b, 5, 2.5, True], stream)
    # Triton's runner passes the grid, the stream, the function, its metadata, launch metadata
    # and two hooks (None, or empty chains), then the arguments; Hot the same, tensors as
    # their pointers and nothing for the metadata and hooks.
    assert got[0][:6] == want[:6] and got[0][6:9] == (None, None, None)
    assert got[0][9:] == (0x7000, 0x9000, 5, 2.5, True) and want[9:] == (a, b, 5, 2.5, True)
    assert got[1][9:] == (0x7000, 0x9000, 6, 2.5, True)


def test_with_a_launch_hook_set_launches_go_through_tritons_runner(stream):
    knobs = triton.knobs.runtime
    seen = []
    hook = seen.append
    if hasattr(knobs.launch_enter_hook, "add"):  # a HookChain (triton >= 3.5)
        knobs.launch_enter_hook.add(hook)
        undo = lambda: knobs.launch_enter_hook.remove(hook)  # noqa: E731
    else:
        before, knobs.launch_enter_hook = knobs.launch_enter_hook, hook
        undo = lambda: setattr(knobs, "launch_enter_hook", before)  # noqa: E731
    try:
        assert launch.launch_hooks_set()
        kernel = Kernel()
        a = CudaBuffer(0x7000)
        hot = launch.Hot(kernel, (2,), [a, 0], free=1, meta={})
        hot(1)
        hot(2)
        assert hot.path == "runner"
        (args,) = kernel.compiled.launches
        assert args[0:4] == (2, 1, 1, stream) and args[7] is not None  # the hook travels
        assert args[9:] == (a, 2)  # and the tensor, as Triton's runner passes it
    finally:
        undo()
    assert not launch.launch_hooks_set()


def test_without_a_cuda_tensor_or_with_direct_launch_off_every_call_goes_through_the_jit(
        stream, monkeypatch):
    kernel = Kernel()
    hot = launch.Hot(kernel, (1,), [torch.zeros(2), 0], free=1, meta={})  # a CPU tensor
    hot(1)
    hot(2)
    assert len(kernel.jit_calls) == 2 and not hot.direct and hot.path == "jit"
    monkeypatch.setenv("GPUPACE_DIRECT_LAUNCH", "0")
    kernel = Kernel()
    hot = launch.Hot(kernel, (1,), [CudaBuffer(0x7000), 0], free=1, meta={})
    hot(1)
    hot(2)
    assert len(kernel.jit_calls) == 2 and not hot.direct and not kernel.compiled.launches
