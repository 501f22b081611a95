"""gpupace: measure every rank's arrival at each collective, show the coordination costs of a
data-parallel job, and delay early ranks so that they enter each collective closer together."""

from .jit import ensure_numba_cache

ensure_numba_cache()  # before the first njit(cache=True), which would raise without a place

from .config import PaceConfig  # noqa: E402
from .integrations.ddp import ddp_comm_hook  # noqa: E402
from .pacer import Pacer  # noqa: E402

__version__ = "0.1.0"
__all__ = ["PaceConfig", "Pacer", "ddp_comm_hook", "__version__"]
