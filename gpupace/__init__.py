"""gpupace: measure every rank's arrival at each collective, show the coordination costs of a
data-parallel job, and delay early ranks so that they enter each collective closer together."""

from .config import PaceConfig
from .integrations.ddp import ddp_comm_hook
from .pacer import Pacer

__version__ = "0.1.0"
__all__ = ["PaceConfig", "Pacer", "ddp_comm_hook", "__version__"]
