"""experiments/btl_convergence.py: the risk, the preference matrices and the convergence claim."""
from __future__ import annotations

import doctest
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import btl_convergence as btl  # noqa: E402


def brute_force_risk(scores, P, mu):
    """er(s) by a float64 double loop over the unordered pairs."""
    total = 0.0
    n = len(scores)
    for i in range(n):
        for j in range(i + 1, n):
            if scores[i] > scores[j]:
                total += mu[i, j] * P[j, i]      # j wins although ranked below
            elif scores[j] > scores[i]:
                total += mu[i, j] * P[i, j]
            else:
                total += mu[i, j] * 0.5 * (P[i, j] + P[j, i])
    return total


def random_preferences(n, rng):
    upper = np.triu(rng.uniform(0.05, 0.95, size=(n, n)), 1)
    P = upper + np.triu(1 - upper, 1).T
    return P


def test_doctests():
    assert doctest.testmod(btl, raise_on_error=False).failed == 0


def test_risk_matches_double_loop():
    rng = np.random.default_rng(0)
    for n in (2, 5, 9):
        P, mu = random_preferences(n, rng), btl.pair_distribution(n, rng)
        scores = rng.integers(0, 3, size=n).astype(float)      # with ties
        assert btl.disagreement_risk(scores, P, mu) == pytest.approx(brute_force_risk(scores, P, mu), abs=1e-12)


def test_risk_is_the_rate_of_contradicting_comparisons():
    rng = np.random.default_rng(1)
    P, mu = random_preferences(6, rng), btl.pair_distribution(6, rng)
    scores = rng.standard_normal(6)
    m = 400_000
    wins = btl.sample_comparisons(P, mu, m, rng)
    assert wins.sum() == m
    above = scores[:, None] > scores[None, :]
    contradicted = wins[~above & ~np.eye(6, dtype=bool)].sum() / m   # winner ranked below the loser
    # standard error at most sqrt(1/4 / m) = 0.0008
    assert contradicted == pytest.approx(btl.disagreement_risk(scores, P, mu), abs=0.004)


def test_pair_distribution_and_disagreement():
    mu = btl.pair_distribution(7, np.random.default_rng(2))
    assert np.allclose(mu, mu.T) and np.all(np.diag(mu) == 0)
    assert np.triu(mu, 1).sum() == pytest.approx(1.0)
    s = np.array([4.0, 3.0, 2.0, 1.0])
    swapped = np.array([3.0, 4.0, 2.0, 1.0])
    assert btl.disagreement(swapped, s) == 1 / 6


def test_btl_is_reversible_and_cycles_are_not():
    rng = np.random.default_rng(3)
    assert btl.kolmogorov_gap(btl.btl_matrix(rng.standard_normal(8))) < 1e-10
    cycle = np.array([[0.0, 0.8, 0.2], [0.2, 0.0, 0.8], [0.8, 0.2, 0.0]])   # 0 > 1 > 2 > 0
    # ln(P_01 P_12 P_20) − ln(P_02 P_21 P_10) = 3 ln 0.8 − 3 ln 0.2
    assert btl.kolmogorov_gap(cycle) == pytest.approx(3 * np.log(0.8) - 3 * np.log(0.2), rel=1e-9)
    trap = btl.trap_matrix(rng.permutation(8))
    assert btl.kolmogorov_gap(trap) > 0.1
    for P in (btl.btl_matrix(rng.standard_normal(8)), trap):
        off = ~np.eye(8, dtype=bool)
        assert np.allclose((P + P.T)[off], 1.0)


@pytest.mark.parametrize("kind", ["btl", "trap"])
def test_optimal_ranking_minimises_risk_over_all_permutations(kind):
    X, P, mu, optimal = btl.make_problem(kind, 6, seed=4)
    best = min(btl.disagreement_risk(np.array(perm, dtype=float), P, mu)
               for perm in itertools.permutations(range(6)))
    assert btl.disagreement_risk(optimal, P, mu) == pytest.approx(best, abs=1e-12)


def test_trap_fools_scores_but_not_btl():
    """The m → ∞ limit of least squares is exact under BTL and wrong on every trapped pair."""
    n = 10
    _, P, _, optimal = btl.make_problem("btl", n, seed=5)
    assert btl.disagreement(btl.least_squares_scores(P), optimal) == 0
    _, P, _, optimal = btl.make_problem("trap", n, seed=5)
    assert btl.disagreement(btl.least_squares_scores(P), optimal) >= (n // 2) / (n * (n - 1) / 2)


def test_bound_is_vacuous_on_the_grid():
    _, P, mu, optimal = btl.make_problem("btl", 30, seed=0)
    assert btl.bound_vacuous_until(P, mu, optimal) > 1e6
    assert btl.sample_bound(P, mu, optimal, 1e6) == np.inf or btl.sample_bound(P, mu, optimal, 1e6) >= 1


def test_more_comparisons_converge_under_btl_only():
    out = btl.run(ms=(100, 10_000), seeds=2, n_items=10, n_estimators=30, steps=80)
    for method in ("lambdamart", "ranknet"):
        btl_d = out["results"]["btl"][method]["disagreement"].mean(0)
        assert btl_d[1] < btl_d[0] and btl_d[1] <= 0.05
        trap = out["results"]["trap"][method]
        assert trap["disagreement"].mean(0)[1] >= 0.5 * (5 / 45)     # most of the 5 trapped pairs stay wrong
        assert np.all(trap["excess_risk"][:, 1] > 0)


def test_main_small_writes_figure_and_section(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(btl, "FIGURE", tmp_path / "img" / "btl.png")
    monkeypatch.setattr(btl, "RESEARCH", tmp_path / "research.md")
    btl.main(["--small", "--write"])
    assert (tmp_path / "img" / "btl.png").stat().st_size > 0
    text = (tmp_path / "research.md").read_text()
    assert "<!-- btl_convergence:start -->" in text and "python experiments/btl_convergence.py --small --write" in text
