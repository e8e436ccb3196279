"""Secret random streams cannot be replayed from the published run seed.

Adversary: the honest-but-curious server, holding the run folder it is entitled to
(config.toml with the seed, messages.jsonl, payloads.bin) and the library's source code.
Before issue 13, each client's randomized t and support noise came from
``np.random.default_rng([seed, i])``: the FedWAD attack below recovered every data point of a
client to 1e-15 from those files alone. Now the streams come from the OS CSPRNG, and only the
explicit ``insecure_deterministic`` switch (recorded in config.toml) makes the replay work again.
"""

from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path

import numpy as np
import ot
import pytest
import torch
from safetensors.numpy import load

import secureffm
from secureffm.audit.verify import verify_run
from secureffm.federation.parties import STREAM_PURPOSES, SecretStreams, new_client
from secureffm.methods.fedwad import FedWADConfig
from secureffm.runs.fedwad import FedWADRun, run_fedwad

T_LOW, T_HIGH = 0.2, 0.8  # protocols/fedwad-private.toml


def _fedwad_run(tmp_path: Path, deterministic: bool):
    run = FedWADRun(FedWADConfig(exact=True, support_size=150, iterations=2, seed=7),
                    data="gaussians", clients=2, samples=150, dim=2, protocol="fedwad-private",
                    seed=7, out=str(tmp_path / f"det-{deterministic}"), keep_payloads=True,
                    progress=False, insecure_deterministic=deterministic)
    return run_fedwad(run)


def _payload(out: Path, **match) -> dict:
    """The payload of the first logged delivery whose fields equal ``match``."""
    blob = (out / "payloads.bin").read_bytes()
    for line in (out / "messages.jsonl").read_text().splitlines():
        record = json.loads(line)
        if all(record.get(k) == v for k, v in match.items()):
            return load(blob[record["offset"]:record["offset"] + record["bytes"]])
    raise AssertionError(f"no delivery {match}")


def _invert(out: Path, t: float) -> np.ndarray:
    """The attack: pair client-1's first returned measure with xi^(0) by one OT plan and
    solve r = (1 - t) x + t z for x."""
    xi = _payload(out, round=1, kind="measure", sender="server", recipient="client-1")
    moved = _payload(out, round=1, kind="measure", sender="client-1", recipient="server")
    r, z = moved["support"], xi["support"]
    plan = ot.emd(moved["weights"], xi["weights"], ot.dist(r, z), numItermax=10**7)
    rows, cols = np.nonzero(plan > 1e-12)
    return (r[rows] - t * z[cols]) / (1 - t)


def _error(recovered: np.ndarray, data: np.ndarray) -> float:
    """Largest distance from a true point to its recovered counterpart (exact matching)."""
    cost = ot.dist(recovered, data)
    plan = ot.emd(np.full(len(recovered), 1 / len(recovered)), np.full(len(data), 1 / len(data)),
                  cost, numItermax=10**7)
    rows, cols = np.nonzero(plan > 1e-12)
    return float(np.linalg.norm(recovered[rows] - data[cols], axis=1).max())


def _replays(out: Path) -> dict[str, float]:
    """t of client-1's first interpolation as an attacker replays it from config.toml."""
    seed = tomllib.loads((out / "config.toml").read_text())["seed"]
    return {"documented derivation": SecretStreams("client-1", seed).numpy("protocol")
            .uniform(T_LOW, T_HIGH),
            "the old per-client seed": np.random.default_rng([seed, 1]).uniform(T_LOW, T_HIGH)}


def _client_one_data() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((150, 2))  # runs/fedwad.py: client 1


def test_fedwad_private_data_cannot_be_recovered_by_replaying_the_seed(tmp_path):
    """The server replays t from the published seed and inverts the interpolation: it fails
    (before the fix, both replays recovered all 150 points to 1e-15)."""
    out = _fedwad_run(tmp_path, deterministic=False).out
    data = _client_one_data()
    for how, t in _replays(out).items():
        assert _error(_invert(out, t), data) > 1e-6, how
    result = json.loads((out / "result.json").read_text())
    assert result["secret_randomness"].startswith("os-entropy")


def test_the_insecure_switch_makes_the_attack_work_and_says_so(tmp_path):
    """The same attack against a run made with insecure_deterministic recovers the data, which
    shows the attack is real; the run folder states that no privacy claim holds."""
    out = _fedwad_run(tmp_path, deterministic=True).out
    t = _replays(out)["documented derivation"]
    assert _error(_invert(out, t), _client_one_data()) < 1e-9
    assert tomllib.loads((out / "config.toml").read_text())["insecure_deterministic"] is True
    assert "INSECURE" in json.loads((out / "result.json").read_text())["secret_randomness"]
    assert "secret randomness: INSECURE" in verify_run(out).summary()


@pytest.mark.parametrize("purpose", STREAM_PURPOSES)
def test_every_client_stream_differs_from_every_replay(purpose):
    """A client built as the runners build it (``new_client``) draws streams that neither the
    documented derivation nor the old per-party seeds reproduce; under the switch they match
    the documented derivation exactly."""
    data = torch.zeros(4, 2)
    secret = new_client("client-1", data)
    draws = secret.streams.torch(purpose).seed(), secret.streams.numpy(purpose).random(4)
    replay = SecretStreams("client-1", 0)
    assert draws[0] != replay.torch(purpose).initial_seed()
    assert not np.allclose(draws[1], replay.numpy(purpose).random(4))
    assert not np.allclose(secret.protocol_rng.random(4), np.random.default_rng([0, 1]).random(4))
    seeded = new_client("client-1", data, deterministic_seed=0)
    assert seeded.streams.torch(purpose).initial_seed() == replay.torch(purpose).initial_seed()
    assert np.array_equal(seeded.protocol_rng.random(4), replay.numpy("protocol").random(4))
    assert torch.equal(torch.rand(4, generator=seeded.generator),
                       torch.rand(4, generator=replay.torch("training")))


# Calls that seed a generator, and the only places allowed to: public choices (data generation,
# partitions, initial weights, the server's own draws, the evaluator) or SecretStreams itself.
# docs/protocols.md ("Random streams") lists the same places and why each is safe.
_SEEDING = {"default_rng", "manual_seed", "Generator", "party_generator", "RandomState"}
_ALLOWED = {
    "federation/parties.py": "SecretStreams: OS entropy, or the documented insecure switch",
    "runtime.py": "party_generator: public streams (evaluator, the server's own draws)",
    "runs/ffm.py": "torch.manual_seed(seed) for initial weights; the evaluator's public stream",
    "runs/dcfm.py": "the evaluator and DCFM-B's server draw from public streams",
    "methods/dcfm.py": "initial_model: the public initial weights, torch.manual_seed(seed), forked",
    "data/pairs.py": "public synthetic data and partition",
    "data/modes2d.py": "public synthetic data and partition",
    "data/colored_digits.py": "public data generation and partition",
    "data/images.py": "public synthetic data (the shapes set)",
    "data/digits.py": "public class-pair split",
    "runs/fedwad.py": "public synthetic gaussians",
    "methods/fedwad.py": "the one-process reference (all parties in one process, no messages)",
    "methods/fedwad_federated.py": "the server's own xi^(0) and t (public to the server)",
    "methods/fedwad_coreset.py": "the server's choice of clients per epoch",
    "methods/client_clustering.py": "initial weights of the per-cluster models",
    "metrics/attribute_classifier.py": "the evaluator's classifier",
    "protocols/secagg/client.py": "Skellam noise from a generator seeded by secrets.randbits(128)",
    "privacy/canaries.py": "canary directions from a generator seeded by secrets.randbits(64)",
    "audit/attacks/inversion_run.py": "the attacker's own starts (outside the federation)",
    "audit/attacks/membership.py": "the attacker's choice of members and draws",
    "audit/attacks/tabular_membership.py": "the attacker's draws on a tabular run",
    "protocols/ckks.py": "flooding noise from a generator seeded by secrets.randbits(128)",
    "data/silo.py": "which rows a client holds out: a public fraction, by the public seed",
    "metrics/tabular.py": "which held-out rows a client's W2 uses (its score is released anyway)",
    "runs/synthetic.py": "sampling noise of a released model: OS entropy unless --seed is given",
    "methods/dp_marginals.py": "the DP baseline's Laplace noise, seeded by secrets.randbits(128)",
    "runs/preflight.py": "a dry run of the public partition on one point per label group",
}


def test_only_public_choices_seed_a_generator_from_a_seed():
    """Every call that seeds a generator in secureffm/ is in a file whose public stream is
    listed above; a new seeded stream must be argued there and in docs/protocols.md."""
    root = Path(secureffm.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in _SEEDING:
                    found.add(path.relative_to(root).as_posix())
    unexpected = sorted(found - set(_ALLOWED))
    assert not unexpected, f"seeded generators outside the public list: {unexpected}"


def test_a_run_is_reproducible_only_under_the_insecure_switch(small_config, tmp_path):
    """Two secure-aggregation runs with one published seed train on different secret streams
    (batches, x0, t, stochastic rounding), so their models and W2 differ; under
    insecure_deterministic they are equal."""
    from secureffm.runs import run

    def w2(name: str, deterministic: bool) -> dict:
        result = run(small_config(method="vanilla", protocol="secagg", rounds=3,
                                  eval_samples=50, nfe=(1,), trajectories=10,
                                  insecure_deterministic=deterministic,
                                  out=str(tmp_path / name)))
        return result.metrics["eval"]["w2"]

    assert w2("a", False) != w2("b", False)
    assert w2("c", True) == w2("d", True)
