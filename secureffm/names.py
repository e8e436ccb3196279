"""The public names a run config chooses among, kept apart from the modules that implement
them so that ``secureffm.config`` and the command line load without torch (docs/benchmarks.md,
"Start-up")."""

from __future__ import annotations

__all__ = ["PAIRS", "IMAGE_DATA", "CLIENT_DATA", "IMAGE_FOLDER", "SILO_DATA", "IMAGE_LABELS",
           "UNET_LAYOUTS", "ACCOUNTANTS"]

# The 2D source-target pairs (secureffm.data.pairs).
PAIRS = ("8gaussians-moons", "uniform-8gaussians", "gaussian-moons", "gaussian-8gaussians")
# Image data sets (secureffm.data.images).
IMAGE_DATA = ("cifar10", "mnist", "colored-mnist", "shapes", "digits")
CLIENT_DATA = "table"  # the ``data`` name of a run on the clients' own tables (data/silo.py)
# The ``data`` name of a run on the clients' own folders of PNG/JPEG images (data/silo.py).
IMAGE_FOLDER = "image-folder"
SILO_DATA = (CLIENT_DATA, IMAGE_FOLDER)  # runs where each client reads its own data
# Where a client's image labels come from: none, each file name's prefix before "_", or the
# labels.csv (file,label) inside its folder.
IMAGE_LABELS = ("none", "names", "csv")
# U-Net layouts by name (secureffm.models.unet.LAYOUTS holds one class per name).
UNET_LAYOUTS = ("compact", "guided")
# Opacus' accountants a DP run is calibrated and enforced by (secureffm.privacy.accounting).
ACCOUNTANTS = ("rdp", "prv")
