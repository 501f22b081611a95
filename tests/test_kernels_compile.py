"""Every Triton kernel compiled for Hopper (sm_90, the H200), on the CPU: the interpreter runs
the kernels' arithmetic but never their compiled path (the `%globaltimer` inline asm, the
types Triton infers, the launch shapes), which otherwise first meets a compiler on a lent GPU.
Triton compiles for a named target without a GPU and with its own ptxas (~9 s for all). The
CuPy reduction's CUDA source goes through nvcc where one is installed.

It binds the arguments as `JITFunction.run` does (Triton 3.6 and 3.9 checked); with a Triton
whose internals differ it skips, naming what is missing, rather than fail for that reason.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess

import pytest
import torch

from gpupace import PaceConfig, policy

pytestmark = pytest.mark.timeout(240)

M = 4  # sites in the rows the site kernels see


@pytest.fixture(scope="module")
def hopper():
    """compile(jit_fn, *args, **kwargs) -> Triton's compiled kernel for sm_90."""
    if os.environ.get("TRITON_INTERPRET"):
        pytest.skip("TRITON_INTERPRET is set: the kernels are interpreted functions")
    try:
        from triton import compile as triton_compile
        from triton import knobs
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature
    except ImportError as e:
        pytest.skip(f"this Triton lacks the offline compile path used here: {e}")

    mods = {name: importlib.import_module(f"gpupace.kernels.{name}")
            for name in ("clock", "spin", "stamp", "barrier", "update")}
    launch = importlib.import_module("gpupace.kernels.launch")
    if not isinstance(mods["clock"]._clock_kernel, JITFunction):  # loaded under the interpreter
        mods = {name: importlib.reload(m) for name, m in mods.items()}
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)

    def compile(fn, *args, **kwargs):
        kwargs = {**launch.COMPILE_OPTIONS, **kwargs}  # as every launch of the kernels
        kwargs.setdefault("debug", False)
        for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # as run() adds them
            if hasattr(knobs.compilation, knob):
                kwargs[knob] = getattr(knobs.compilation, knob)
        try:
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, spec, opts = binder(*args, **kwargs)
            options, sig, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
        except (AttributeError, TypeError) as e:
            pytest.skip(f"this Triton binds arguments otherwise: {type(e).__name__}: {e}")
        return triton_compile(ASTSource(fn, sig, constexprs, attrs), target=target,
                              options=options.__dict__)

    return compile, mods


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


def test_site_kernels_compile_for_hopper_and_read_the_global_timer(hopper):
    compile, k = hopper
    spin = k["spin"]
    i32, i64 = torch.int32, torch.int64
    row, stamps, clk = zeros(2 + 2 * M), zeros(M, 3, dtype=i64), zeros(2, dtype=i64)
    caps = dict(USE_CLOCK=True, HARD_CAP=spin.HARD_CAP_US, HARD_READS=spin.HARD_MAX_READS,
                num_warps=1)
    compiled = {
        "clock": compile(k["clock"]._clock_kernel, zeros(64, dtype=i64), 64, 1, USE_CLOCK=True,
                         num_warps=1),
        "spin": compile(spin._spin_kernel, zeros(1), zeros(1), zeros(1, dtype=i32), clk, 2000.0,
                        spin.max_reads_for(2000.0), 1000, **caps),
        "skew spin": compile(spin._skew_kernel, zeros(1), zeros(1, dtype=i64), zeros(1),
                             zeros(1, dtype=i32), clk, 1e6, spin.max_reads_for(1e6), 1000, **caps),
        "enter": compile(spin._enter_kernel, zeros(1, M), zeros(M), row, stamps, clk, 1, 0, M,
                         50_000.0, 0.1, spin.max_reads_for(50_000.0), 1000, **caps),
        "stamp": compile(k["stamp"]._stamp_kernel, zeros(64, dtype=i64), 0, clk, USE_CLOCK=True,
                         num_warps=1),
        "exit": compile(k["stamp"]._exit_kernel, row, stamps, clk, 1, USE_CLOCK=True,
                        num_warps=1),
    }
    compiled["sm offsets"] = compile(k["clock"]._offsets_kernel, zeros(8, 4, 2, dtype=i64),
                                     zeros(8, 4, 3, dtype=i64), zeros(8, dtype=i32), 4, 1000, 1,
                                     USE_CLOCK=True, num_warps=1)
    assert "%smid" in compiled["sm offsets"].asm["ptx"]
    assert "atom.global" in compiled["skew spin"].asm["ptx"]  # the common start: an atomic min
    for warps in (1, 16):  # the virtual cluster's barrier, on one warp and as K CTAs would
        compiled[f"barrier, {warps} warps"] = compile(
            k["barrier"]._barrier_kernel, zeros(1, dtype=i32), 8, 200_000_000, 100_000_000,
            zeros(1, dtype=i32), clk, 1000, USE_CLOCK=True, num_warps=warps)
    for name, kernel in compiled.items():
        # The clock is the inline asm: in the PTX, not folded away or left to the interpreter.
        assert "%globaltimer" in kernel.asm["ptx"], name
        assert kernel.asm.get("cubin"), name  # ptxas ran: the PTX is valid for sm_90
    # The spin with a backoff sleeps between its clock reads; without, it never sleeps.
    backoff = compile(spin._spin_kernel, zeros(1), zeros(1), zeros(1, dtype=i32), clk, 2000.0,
                      spin.max_reads_for(2000.0), 1000, BACKOFF=256, **caps)
    assert re.search(r"nanosleep\.u32", backoff.asm["ptx"]) and backoff.asm.get("cubin")
    assert "%globaltimer" in backoff.asm["ptx"]
    assert "nanosleep" not in compiled["spin"].asm["ptx"]
    # The exit stamp reads nothing from memory (a load's round trip was a third of its time).
    assert "ld.global" not in compiled["exit"].asm["ptx"]
    finish = compile(k["stamp"]._finish_kernel, row, stamps, clk, M, 16, num_warps=1)
    assert finish.asm.get("cubin")


@pytest.mark.parametrize("n,own", [(1, 1), (3, 3), (4096, 1)])
def test_update_kernel_compiles_for_hopper(hopper, n, own):
    """One program a rank updated, a vector over 64 sites; at 4096 ranks, the record's pass
    over them. The launcher's own arguments, on CPU tensors."""
    compile, k = hopper
    update = k["update"]
    reduce = importlib.import_module("gpupace.kernels.reduce")
    p = policy.PolicyParams.from_config(PaceConfig(mode="pace"), n)
    m = 64
    ring = zeros(256, update.record_len(n, m))
    _, args, meta = update.launch_args(
        zeros(n, 2 + 2 * m), zeros(2 + 2 * m), reduce.outputs(n, m),
        update.new_state(own, m, world_size=n),
        ring, zeros(256, dtype=torch.int64), p, n_sites=1, rank=0)
    kernel = compile(update._update_kernel, *args, **meta)
    assert kernel.asm.get("cubin")
    assert kernel.metadata.num_warps == meta["num_warps"]
    assert kernel.metadata.enable_fp_fusion is True  # pinned (launch.COMPILE_OPTIONS)
    # no local memory: nothing spilled, no register array indexed at run time
    assert ".local" not in kernel.asm["ptx"], "the update kernel spills"


def test_cupy_reduction_compiles_for_hopper(tmp_path):
    """The CuPy reduction's CUDA source through nvcc for sm_90, where nvcc is installed (CuPy
    compiles it with NVRTC on the GPU, at warm-up): it must build, spill nothing, and fit 1024
    threads a block in the 64K registers of an SM."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    from gpupace.kernels.reduce import _SOURCE

    src = tmp_path / "reduce.cu"
    src.write_text(_SOURCE)
    out = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
                          str(tmp_path / "reduce.cubin"), str(src)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "0 bytes spill stores" in out.stderr, out.stderr
    regs = int(re.search(r"Used (\d+) registers", out.stderr).group(1))
    assert regs * 1024 <= 65536, regs
