"""The old path of `vkmulti.Image` and its helpers (now `vkmulti.memory.image`), an alias for one release."""
from .memory.image import *  # noqa: F401,F403
from .memory.image import __all__  # noqa: F401
