"""rankkit.boosting.ensemble: the oblivious ensemble exported (TorchScript, torch.export) equals eager,
and checks its buffers and input."""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting import ObliviousEnsemble

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread

# -- persistence and export ---------------------------------------------------------------------------


def test_torchscript_and_torch_export_equal_eager(fitted, tmp_path):
    model, x = fitted
    eager = model.ensemble_(x)
    scripted = torch.jit.script(model.ensemble_)
    path = tmp_path / "model.pt"
    scripted.save(str(path))
    assert torch.equal(torch.jit.load(str(path))(x), eager)
    program = torch.export.export(model.ensemble_, (x,))
    assert torch.equal(program.module()(x), eager)


def test_ensemble_checks_its_buffers_and_input():
    with pytest.raises(ValueError, match="leaf_values"):
        ObliviousEnsemble(3, torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, 3))
    m = ObliviousEnsemble(3, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2), torch.zeros(0, 4), 1.5)
    assert m(torch.zeros(4, 3)).tolist() == [1.5] * 4
    with pytest.raises(ValueError, match="N, 3"):
        m(torch.zeros(4, 2))


def test_averaged_scores_the_mean_of_its_parts_and_refuses_unlike_ones():
    from rankkit.boosting.ensemble import averaged

    g = torch.Generator().manual_seed(0)

    def random_ensemble(trees, depth=3, features=4):
        return ObliviousEnsemble(features, torch.randint(0, features, (trees, depth), generator=g),
                                 torch.randn(trees, depth, generator=g), torch.randn(trees, 1 << depth, generator=g),
                                 bias=float(torch.randn(1, generator=g)))

    parts = [random_ensemble(5), random_ensemble(2), random_ensemble(7)]
    x = torch.randn(50, 4, generator=g)
    torch.testing.assert_close(averaged(parts)(x), sum(p(x) for p in parts) / 3, rtol=1e-5, atol=1e-5)
    assert averaged(parts[:1]) is parts[0]
    with pytest.raises(ValueError, match=r"`parts\[1\]` has 4 features and depth 2"):
        averaged([parts[0], random_ensemble(2, depth=2)])
