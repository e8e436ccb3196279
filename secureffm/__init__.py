"""secureffm: privacy-preserving generative modeling across data silos."""

from .config import RunConfig, load_config
from .errors import SecureFFMError

__version__ = "0.1.0"
__all__ = ["RunConfig", "load_config", "SecureFFMError", "__version__"]
