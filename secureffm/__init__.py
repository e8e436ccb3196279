"""secureffm: privacy-preserving generative modeling across data silos."""

from .config import RunConfig, load_config
from .errors import SecureFFMError

__version__ = "0.1.0"
__all__ = ["RunConfig", "load_config", "SecureFFMError", "load", "__version__"]


def load(run, device: str = "cpu"):
    """The trained model of a finished FFM run folder or an export, with ``.sample(n)``
    (:func:`secureffm.runs.synthetic.load`; torch loads on this first call)."""
    from .runs.synthetic import load as load_run

    return load_run(run, device)
