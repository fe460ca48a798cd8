"""What a real GPU rejects on first contact and the simulated device (tests/simcuda.py) used to
let through: a random draw whose generator is on another device than the tensor it
fills. CUDA raises "Expected a 'cuda' device type for generator but found 'cpu'"; the
simulation made every generator a CPU one and so hid it.

* the simulated device now keeps the device a generator was made for and raises as CUDA does;
* every randomised option of the booster (row and query sampling, Bayesian bagging, split
  noise, quantized gradients' stochastic rounding, XE-NDCG's random targets) fits on it.

(The Triton kernels' own first-contact checks -- float64 compiles, the left-out node, relaxed
atomics -- are in tests/kernels/triton/test_histogram.py and test_lambdas.py.)
"""
from __future__ import annotations

import pytest
import torch

from simcuda import simcuda


def test_simulated_device_rejects_a_generator_of_the_other_device():
    with simcuda():
        cuda_gen = torch.Generator(device="cuda").manual_seed(0)
        cpu_gen = torch.Generator().manual_seed(0)
        assert cuda_gen.device.type == "cuda" and cpu_gen.device.type == "cpu"
        assert torch.rand(3, generator=cuda_gen, device="cuda").device.type == "cuda"
        assert torch.rand(3, generator=cpu_gen).device.type == "cpu"
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator"):
            torch.rand(3, generator=cpu_gen, device="cuda")
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator"):
            torch.randn(4, 5, generator=cpu_gen, dtype=torch.float64, device="cuda")
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator"):
            torch.rand(3, generator=cuda_gen)
        x = torch.zeros(3, device="cuda")
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator"):
            x.uniform_(generator=cpu_gen)


def test_xendcg_with_a_host_generator_fills_cuda_scores():
    from rankkit.losses import xendcg_loss

    g = torch.Generator().manual_seed(1)
    scores, labels = torch.randn(2, 5), torch.randint(0, 3, (2, 5)).float()
    ref = xendcg_loss(scores, labels, generator=torch.Generator().manual_seed(1))
    with simcuda():
        got = xendcg_loss(scores.cuda(), labels.cuda(), generator=g)
        got = [t.cpu() for t in got]
    for a, b in zip(got, ref):  # the host draws: the same γ on either device
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("objective", ["lambdarank", "xendcg"])
def test_every_random_option_fits_on_the_simulated_device(objective):
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data import make_synthetic

    data = make_synthetic(10, (2, 12), 4, seed=0)
    config = BoosterConfig(objective=objective, depth=2, min_data_in_leaf=2, subsample=0.8,
                           colsample=0.75, bagging_temperature=1.0, random_strength=0.5,
                           quantized_grad=objective == "lambdarank", seed=3)
    with simcuda():
        engine = BoostingEngine(data.features, data.labels, data.sizes, config, device="cuda")
        engine.add_eval_set(data.features, data.labels, data.sizes)
        for _ in range(2):
            tree = engine.update()
        assert tree.leaf_values.device.type == "cpu"  # the host copy of the round's tree ...
        assert tree.leaf_index.device.type == "cuda"  # ... and the documents' leaves where they live
    assert len(engine.history["valid_0"]["ndcg@10"]) == 2
