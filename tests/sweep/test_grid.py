"""Reading a sweep file: every cell built and checked before anything runs; a bad file is
refused naming the key (or the method, protocol or epsilon) to change."""

from __future__ import annotations

import math

import pytest

from secureffm.cli import main
from secureffm.errors import ConfigError
from secureffm.protocols.protocol import load_protocol, without_dp
from secureffm.protocols.registry import known_protocols, read_spec
from secureffm.sweep import load_sweep, smoke_spec, sweep_from_dict

GOOD = """
root = "{root}"
attacks = []

[grid]
methods = ["vanilla", "got"]
protocols = ["dp", "dp-secagg"]
epsilons = [2, 8, inf]
seeds = [0, 1]

[run]
rounds = 7
nfe = [2, 32]
"""


def _write(tmp_path, text: str):
    path = tmp_path / "grid.toml"
    path.write_text(text.format(root=tmp_path / "runs"))
    return path


def test_cells_cover_the_grid_with_the_base_settings(tmp_path):
    spec = load_sweep(_write(tmp_path, GOOD))
    cells = spec.cells()
    assert len(cells) == 2 * 2 * 3 * 2 and len({c.name for c in cells}) == len(cells)
    assert [c.name for c in cells[:3]] == ["vanilla-dp-e2-s0", "vanilla-dp-secagg-e2-s0",
                                           "got-dp-e2-s0"]
    by_name = {c.name: spec.config(c) for c in cells}
    dp8 = by_name["got-dp-secagg-e8-s1"]
    assert (dp8.protocol, dp8.target_epsilon, dp8.seed, dp8.rounds, dp8.nfe) == \
        ("dp-secagg", 8.0, 1, 7, (2, 32))
    assert dp8.out == str(tmp_path / "runs" / "got-dp-secagg-e8-s1") and not dp8.keep_payloads


def test_epsilon_inf_runs_the_protocol_without_its_dp_stage(tmp_path):
    spec = load_sweep(_write(tmp_path, GOOD))
    configs = {c.name: spec.config(c) for c in spec.cells()}
    assert (configs["vanilla-dp-einf-s0"].protocol,
            configs["vanilla-dp-secagg-einf-s0"].protocol) == ("plaintext", "secagg")
    assert configs["vanilla-dp-einf-s0"].target_epsilon == 0.0


# Each shipped DP protocol's counterpart, as a reader pairs them by name.
NO_DP = {"dp": "plaintext", "dp-secagg": "secagg", "dp-secagg-distributed": "secagg",
         "dp-secagg-once": "secagg-once", "dp-he": "he", "dp-sealed": "sealed"}


def test_no_dp_counterparts_are_the_shipped_specs_minus_their_dp_stage():
    """Each counterpart, derived from the specs (protocols.protocol.without_dp), is the one a
    reader pairs by name and runs the same other stages (what they protect may be wider: the
    no-DP specs also protect FedFlow's 'update'); every shipped DP protocol has one."""
    with_dp = {n for n in known_protocols() if load_protocol(n).dp is not None}
    assert with_dp - {"fedwad-private"} == set(NO_DP)  # FedWAD's measures are not swept
    assert {name: without_dp(name) for name in with_dp} == NO_DP
    for name, counterpart in NO_DP.items():
        assert load_protocol(counterpart).dp is None

        def rest(spec):
            return [{k: v for k, v in t.items() if k != "protects"} for t in spec.stages
                    if t["stage"] != "dp"]

        assert rest(read_spec(name)) == rest(read_spec(counterpart)), name


def test_attacks_make_every_cell_keep_its_payloads(tmp_path):
    spec = load_sweep(_write(tmp_path, GOOD.replace("attacks = []", 'attacks = ["x"]')))
    assert all(spec.config(c).keep_payloads for c in spec.cells())


def test_overrides_and_smoke(tmp_path):
    spec = load_sweep(_write(tmp_path, GOOD), {"grid": {"epsilons": [8.0]}, "workers": 3,
                                               "run": {"rounds": 9}})
    assert (spec.epsilons, spec.workers, spec.run.rounds, spec.run.nfe) == \
        ((8.0,), 3, 9, (2, 32))
    small = smoke_spec(spec, tmp_path / "smoke")
    assert (small.seeds, small.workers, small.run.rounds, small.run.eval_samples) == \
        ((0,), 1, 2, 100)


def test_root_defaults_to_runs_and_the_file_name(tmp_path):
    spec = load_sweep(_write(tmp_path, GOOD.replace('root = "{root}"', "")))
    assert str(spec.root) == "runs/grid"


@pytest.mark.parametrize("change, fragment", [
    (("[grid]", "colour = 1\n[grid]"), "unknown key 'colour'"),
    (("seeds = [0, 1]", "seeds = [0, 1]\nnfe = [1]"), "[grid]: unknown key 'nfe'"),
    (("rounds = 7", "roundz = 7"), "unknown config key 'roundz'"),
    (("rounds = 7", "rounds = 0"), "rounds = 0"),
    (("rounds = 7", "seed = 3"), "[run] seed: each cell sets it"),
    (('"vanilla", "got"', '"vanilla", "gott"'), "methods: 'gott'"),
    (('"vanilla", "got"', '"vanilla", "dcfm-a"'), "methods: 'dcfm-a'"),
    (('"dp", "dp-secagg"', '"dp", "dpp"'), "unknown protocol 'dpp'"),
    (("[2, 8, inf]", "[0, 8]"), "epsilons = [0, 8]"),
    (("[2, 8, inf]", "[-1]"), "epsilons = [-1]"),
    (("[2, 8, inf]", "[nan]"), "epsilons = [nan]"),
    (("[2, 8, inf]", '["8"]'), "epsilons = ['8']"),
    (("[2, 8, inf]", "[8, 8]"), "epsilons = [8, 8]"),
    (('"dp", "dp-secagg"', '"dp", "secagg"'), "'secagg' has no dp stage"),
    (("seeds = [0, 1]", "seeds = [-1]"), "seeds = [-1]"),
    (('attacks = []', "workers = 0"), "workers = 0"),
    (("[grid]", "[gridd]"), "unknown key 'gridd'"),
])
def test_a_bad_sweep_file_is_refused_naming_what_to_change(tmp_path, change, fragment):
    path = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert fragment in str(err.value)


MY_DP = """name = "mine"
[[stages]]
stage = "dp"
protects = ["gradient", "dual_update"]
clip = 1.0
delta = 1e-5
target_epsilon = 8.0
noise = "local"
accountant = "rdp"
"""


def test_inf_needs_a_known_counterpart(tmp_path):
    """A user's DP spec sweeps at finite epsilons; at inf it runs the shipped spec with its
    other stages (none: plaintext), and is refused when no shipped spec has them (a secagg
    threshold none ships)."""
    mine = tmp_path / "mine.toml"
    mine.write_text(MY_DP)
    values = {"root": "r", "grid": {"methods": ["vanilla"], "protocols": [str(mine)],
                                    "epsilons": [4.0, math.inf]}}
    assert [c.protocol_run for c in sweep_from_dict(values).cells()] == [str(mine), "plaintext"]
    mine.write_text(MY_DP + '[[stages]]\nstage = "secagg"\nprotects = ["gradient"]\n'
                    "threshold = 0.75\n")
    with pytest.raises(ConfigError, match="no known counterpart"):
        sweep_from_dict(values)
    values["grid"]["epsilons"] = [4.0]
    assert sweep_from_dict(values).cells()[0].protocol_run == str(mine)


def test_the_command_refuses_a_bad_file_with_exit_2(tmp_path, capsys):
    path = _write(tmp_path, GOOD.replace("[2, 8, inf]", "[0]"))
    assert main(["sweep", str(path)]) == 2
    assert "epsilons = [0]" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_two_specs_with_one_file_name_are_refused(tmp_path):
    """Their cells would write into one run folder."""
    paths = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.toml").write_text(MY_DP)
        paths.append(str(tmp_path / folder / "x.toml"))
    values = {"root": "r", "grid": {"methods": ["vanilla"], "protocols": paths,
                                    "epsilons": [4.0]}}
    with pytest.raises(ConfigError, match="share a file name"):
        sweep_from_dict(values)
