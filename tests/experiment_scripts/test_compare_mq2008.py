"""experiments/compare_mq2008.py's inputs: experiments/neural_mix.yaml, the ensemble of the two
shipped neural configs that docs/benchmarks.md's comparisons train, read by `rankkit compare` as
one row."""
from pathlib import Path

from rankkit.compare.protocol import _model_configs
from rankkit.training.run_config import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_the_mix_names_the_shipped_lambdarank_and_transformer_configs():
    configs = _model_configs([str(ROOT / "experiments" / "neural_mix.yaml")])
    assert list(configs) == ["LambdaRank-top2"]
    members = configs["LambdaRank-top2"][1]["ensemble"]
    assert [p.resolve() for p, _ in members] == [(Path(CONFIG_DIR) / n).resolve()
                                                 for n in ("lambdarank.yaml", "transformer.yaml")]
    assert [c["model"]["init_args"].get("architecture", "mlp") for _, c in members] == ["mlp", "transformer"]
    assert {c["model"]["init_args"]["encoding"] for _, c in members} == {"piecewise"}


def test_the_neural_ndcg_transformer_is_the_shipped_one_but_for_its_objective():
    import yaml

    shipped = yaml.safe_load((Path(CONFIG_DIR) / "transformer.yaml").read_text())
    variant = yaml.safe_load((ROOT / "experiments" / "transformer_neural_ndcg.yaml").read_text())
    assert variant["model"]["init_args"].pop("objective") == "neural_ndcg"
    assert variant["model"]["init_args"].pop("k") is None
    shipped["model"]["init_args"].pop("weighting"), shipped["model"]["init_args"].pop("k")
    assert variant == shipped
    configs = _model_configs(["transformer", str(ROOT / "experiments" / "transformer_neural_ndcg.yaml")])
    assert list(configs) == ["LambdaRank", "LambdaRank-transformer_neural_ndcg"]  # rows named by their files
