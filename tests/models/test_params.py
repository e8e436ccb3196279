import numpy as np
import torch

from secureffm.models import VelocityMLP, flat_params, load_flat_params


def test_loaded_parameters_do_not_share_memory_with_the_received_vector():
    model = VelocityMLP(2, 8)
    received = flat_params(model) + 1.0
    kept = received.copy()
    load_flat_params(model, received)
    np.testing.assert_array_equal(flat_params(model), kept)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(5.0)  # an optimizer step in place
    np.testing.assert_array_equal(received, kept)
