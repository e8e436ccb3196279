"""A run never leaves another run's claims beside its own.

Adversary: none; this is the honest user's mistake the review found. A ``plaintext`` run into a
folder that held a ``dp-secagg`` run left that run's privacy.json (epsilon 8) beside a
config.toml saying plaintext, so a reader of the folder was told a guarantee that the run
in it never had.
"""

from __future__ import annotations

import json

import pytest

from secureffm.errors import ConfigError
from secureffm.runs import run


def test_a_non_empty_run_folder_is_refused_and_overwrite_clears_old_claims(small_config):
    first = run(small_config(method="vanilla", protocol="dp", target_epsilon=8.0, rounds=3,
                             insecure_deterministic=False))
    claim = json.loads((first.out / "privacy.json").read_text())
    assert claim["secret_randomness"].startswith("os-entropy")
    with pytest.raises(ConfigError, match="--overwrite"):
        run(small_config(method="vanilla", protocol="plaintext", rounds=3))
    assert json.loads((first.out / "privacy.json").read_text())  # the refusal touched nothing
    second = run(small_config(method="vanilla", protocol="plaintext", rounds=3, overwrite=True))
    assert second.out == first.out
    claim = json.loads((second.out / "privacy.json").read_text())
    assert claim["protocol"] == "plaintext" and claim["dp"].startswith("none")
    assert "clients" not in claim  # no epsilon left over from the dp run


def test_the_pin_is_kept_apart_and_catches_a_rebuilt_folder(small_config, tmp_path):
    """A pin inside the run folder is refused (its writer could rewrite it too); the pin a run
    writes elsewhere verifies the honest folder and fails once parties.json is rewritten."""
    from secureffm.audit.verify import verify_run
    from secureffm.federation.pin import load_pin

    with pytest.raises(ConfigError, match="inside the run folder"):
        run(small_config(method="vanilla", rounds=2, pin_to=str(tmp_path / "run" / "pin.json")))
    pin_file = tmp_path / "kept" / "pin.json"
    result = run(small_config(method="vanilla", rounds=2, pin_to=str(pin_file),
                              out=str(tmp_path / "pinned")))
    assert json.loads(pin_file.read_text()) == result.pin
    assert verify_run(result.out, load_pin(pin_file)).ok
    parties = result.out / "parties.json"
    parties.write_text(parties.read_text() + " ")
    assert not verify_run(result.out, load_pin(pin_file)).ok
