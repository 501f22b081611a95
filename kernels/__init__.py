"""Device code only: Triton kernels and the CuPy reduction, each file a private kernel plus a
public launcher. Installed as `gpupace.kernels`. Only this package uses triton and cupy (the
backends' availability checks import them to see whether they can), and nothing here imports
torch.distributed. Kernels take the policy's constants from `gpupace.policy`, the one
reference, rather than copies; `reduce` keeps a copy of ABSURD_US, held equal by a test."""
