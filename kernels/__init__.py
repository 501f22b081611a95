"""Device code only: Triton kernels and the CuPy reduction, each file a private kernel plus a
public launcher. Installed as `gpupace.kernels`. Only this package imports triton and cupy, and
nothing here imports torch.distributed."""
