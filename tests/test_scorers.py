"""List-aware scorers: the (features [Q, L, F], mask [Q, L]) -> [Q, L] contract, the transformer
scorer (permutation equivariance, padding invariance), its training, export and serving."""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankkit.data import make_synthetic
from rankkit.training.datamodule import RankingDataModule
from rankkit.data.dataset import pad
from rankkit.export import export_onnx, export_program, export_torchscript, is_list_aware, load_scorer
from rankkit.metrics import ndcg
from rankkit.neural import LambdaRank, MeanEnsemble, MLPScorer, RankNet, TransformerScorer, score_lists
from rankkit.scorers import FeaturePreprocessor
from rankkit.serving import as_scorer, predict_file, score_queries

F = 6


def transformer(seed=0, **kw):
    torch.manual_seed(seed)
    options = dict(hidden=(16, 8), heads=2, layers=2, dropout=0.0)
    options.update(kw)
    return TransformerScorer(F, **options).eval()


def batch(seed=0, q=3, length=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(q, length, F, generator=g) * 3
    lengths = torch.randint(1, length + 1, (q,), generator=g)
    lengths[0] = length
    return x, torch.arange(length) < lengths[:, None]


# -- the contract ---------------------------------------------------------------------------------
def test_a_pointwise_scorer_is_the_special_case():
    scorer = MLPScorer(F, (8,)).eval()
    x, mask = batch()
    with torch.no_grad():
        scores = score_lists(scorer, x, mask)
        torch.testing.assert_close(scores[mask], scorer(x[mask]))
    assert bool((scores[~mask] == 0).all())
    assert not is_list_aware(scorer) and is_list_aware(transformer())


class PointwiseClaimingLists(torch.nn.Module):
    list_aware = True

    def forward(self, x):
        return x.sum(-1)


class WrongShape(torch.nn.Module):
    def forward(self, x):
        return x.sum(-1, keepdim=True)


@pytest.mark.parametrize("scorer, message", [(PointwiseClaimingLists(), "does not fit the list-aware contract"),
                                             (WrongShape(), r"returned \(3, 7, 1\).*not scores \(3, 7\)")])
def test_a_module_that_fits_neither_contract_is_refused_clearly(scorer, message):
    x, mask = batch()
    with pytest.raises(ValueError, match=message):
        score_lists(scorer, x, mask)


# -- the transformer ------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), latent_cross=st.booleans())
def test_the_transformer_is_permutation_equivariant(seed, latent_cross):
    scorer = transformer(latent_cross=latent_cross)
    x, mask = batch(seed)
    g = torch.Generator().manual_seed(seed)
    perm = torch.stack([torch.randperm(x.shape[1], generator=g) for _ in range(x.shape[0])])
    with torch.no_grad():
        scores = scorer(x, mask)
        permuted = scorer(x.gather(1, perm[..., None].expand_as(x)), mask.gather(1, perm))
    torch.testing.assert_close(permuted, scores.gather(1, perm), rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), extra=st.integers(1, 6), junk=st.sampled_from([0.0, 1e4, float("nan")]))
def test_padding_changes_no_real_documents_score(seed, extra, junk):
    scorer = transformer()
    x, mask = batch(seed)
    wider = torch.cat([x, torch.full((x.shape[0], extra, F), junk)], 1)
    wider[:, : x.shape[1]][~mask] = junk  # padding inside the list holds junk too
    wide_mask = torch.cat([mask, torch.zeros(x.shape[0], extra, dtype=torch.bool)], 1)
    with torch.no_grad():
        scores = scorer(x, mask)
        padded = scorer(wider, wide_mask)
        one_by_one = [scorer(x[i:i + 1, mask[i]], mask[i:i + 1, mask[i]])[0] for i in range(len(x))]
    torch.testing.assert_close(padded[wide_mask], scores[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat(one_by_one), scores[mask], rtol=1e-5, atol=1e-6)


def test_the_context_matters_and_the_latent_cross_is_dasalcs():
    scorer = transformer()
    x, mask = batch()
    mask[:] = True
    with torch.no_grad():
        alone = scorer(x[:1, :1], mask[:1, :1])[0, 0]
        in_list = scorer(x[:1], mask[:1])[0, 0]
        assert abs(float(alone - in_list)) > 1e-4  # a document's score depends on its list
        h = scorer.tower(scorer.preprocess(x))
        c = h
        for block in scorer.blocks:
            c = block(c, mask)
        expected = scorer.head((1 + scorer.norm(c)) * h).squeeze(-1)
    torch.testing.assert_close(scorer(x, mask), expected)


def test_transformer_validates():
    with pytest.raises(ValueError, match="`heads` has to divide"):
        TransformerScorer(F, hidden=(10,), heads=4)
    with pytest.raises(ValueError, match="`hidden` has to hold at least one"):
        TransformerScorer(F, hidden=())
    with pytest.raises(ValueError, match="noise"):
        TransformerScorer(F, noise=-1.0)


def test_noise_is_added_in_training_only():
    pre = FeaturePreprocessor(F, noise=0.5).fit(torch.randn(50, F))
    x = torch.randn(4, F)
    pre.train()
    torch.manual_seed(0)
    noisy = pre(x)
    torch.manual_seed(0)
    expected = ((torch.sign(x) * torch.log1p(x.abs()) - pre.mean) / pre.std + 0.5 * torch.randn(4, F)).clamp(-10, 10)
    torch.testing.assert_close(noisy, expected)
    pre.eval()
    torch.testing.assert_close(pre(x), pre(x))
    assert not torch.allclose(pre(x), noisy)
    with pytest.raises(ValueError, match="`noise` is added by the scorer's FeaturePreprocessor"):
        LambdaRank(scorer=torch.nn.Linear(F, 1), noise=0.1)


# -- export and serving ---------------------------------------------------------------------------
EXPORTERS = {"pt": export_torchscript, "pt2": export_program, "onnx": export_onnx}


@pytest.mark.parametrize("ext", list(EXPORTERS))
def test_every_export_of_a_list_aware_scorer_equals_eager(tmp_path, ext):
    if ext == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    scorer = transformer()
    scorer.preprocess.fit(torch.randn(40, F) * 3)
    path = EXPORTERS[ext](scorer, tmp_path / f"m.{ext}")
    served = load_scorer(path, trust_torchscript=True)
    assert is_list_aware(served)
    for seed, (q, length) in enumerate([(3, 7), (1, 1), (5, 12)]):  # dynamic Q and L, unlike the example
        x, mask = batch(seed, q, length)
        with torch.no_grad():
            eager = scorer(x, mask).masked_fill(~mask, 0.0)
            torch.testing.assert_close(served(x, mask), eager, rtol=1e-5, atol=1e-5)
            if ext == "pt":  # one query [L, F] -> [L]
                torch.testing.assert_close(served(x[0]), scorer(x[:1], torch.ones_like(mask[:1]))[0])


def write_exact_letor(data, path) -> None:
    """``data`` as a LETOR file whose values read back to the same float32 numbers."""
    lines = []
    for q, (start, size) in enumerate(zip(data.offsets[:-1].tolist(), data.sizes.tolist())):
        for i in range(size):
            row = " ".join(f"{j + 1}:{float(v)!r}" for j, v in enumerate(data.features[start + i]))
            lines.append(f"{int(data.labels[start + i])} qid:{q} {row}\n")
    path.write_text("".join(lines))


def test_a_list_aware_scorer_serves_query_by_query(tmp_path):
    scorer = transformer()
    data = make_synthetic(12, (2, 9), F, seed=1)
    scorer.preprocess.fit(data.features)
    export_torchscript(scorer, tmp_path / "m.pt")
    write_exact_letor(data, tmp_path / "d.txt")
    padded, mask = pad(data.features, data.sizes)
    with torch.no_grad():
        expected = scorer(padded, mask)[mask]
    for model in (scorer, str(tmp_path / "m.pt")):
        assert predict_file(model, tmp_path / "d.txt", tmp_path / "s.tsv", trust_torchscript=True) == data.n_docs
        got = torch.tensor([float(line.split("\t")[2]) for line in (tmp_path / "s.tsv").read_text().splitlines()])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # the same scores whatever the number of queries per padded batch
    torch.testing.assert_close(score_queries(as_scorer(scorer), data.features, data.sizes, chunk=1), expected,
                               rtol=1e-5, atol=1e-6)


def test_a_list_aware_scorer_sees_whole_queries_when_predict_streams(tmp_path, monkeypatch):
    # blocks of a few lines cut queries apart; predict_file must still score whole lists
    import rankkit.data.svmlight as svmlight

    scorer = transformer()
    data = make_synthetic(9, (1, 9), F, seed=2)
    scorer.preprocess.fit(data.features)
    write_exact_letor(data, tmp_path / "d.txt")
    monkeypatch.setattr(svmlight, "_BLOCK_BYTES", 300)
    assert sum(1 for _ in svmlight.iter_svmlight(tmp_path / "d.txt", n_features=F)) > data.n_queries
    padded, mask = pad(data.features, data.sizes)
    with torch.no_grad():
        expected = scorer(padded, mask)[mask]
    assert predict_file(scorer, tmp_path / "d.txt", tmp_path / "s.tsv") == data.n_docs
    rows = [line.split("\t") for line in (tmp_path / "s.tsv").read_text().splitlines()]
    got = torch.tensor([float(r[2]) for r in rows])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    doc = (torch.arange(data.n_docs) - torch.repeat_interleave(data.offsets[:-1], data.sizes)).tolist()
    assert [int(r[1]) for r in rows] == doc


def test_a_seed_ensemble_is_the_mean_and_exports(tmp_path):
    from rankkit import LambdaMART

    trees = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=2).fit(make_synthetic(12, 6, F, seed=1))
    members = [transformer(seed=s) for s in range(2)] + [MLPScorer(F, (4,)).eval(), trees.serving_scorer()]
    ensemble = MeanEnsemble(members).eval()
    x, mask = batch()
    with torch.no_grad():
        # the pointwise members score the rows one by one; the trees take only [N, F]
        rows = torch.stack([trees.serving_scorer()(q) for q in x])
        expected = (members[0](x, mask) + members[1](x, mask) + members[2](x) + rows) / 4
        expected = expected.masked_fill(~mask, 0.0)  # the padding scores 0
        torch.testing.assert_close(ensemble(x, mask), expected)
        export_torchscript(ensemble, tmp_path / "e.pt")
        served = load_scorer(tmp_path / "e.pt", trust_torchscript=True)
        torch.testing.assert_close(served(x, mask), expected)
    with pytest.raises(ValueError, match="different feature counts"):
        MeanEnsemble([MLPScorer(3), MLPScorer(4)])


# -- training -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_data():
    full = make_synthetic(90, (5, 25), F, seed=0)
    return full.subset(range(60)), full.subset(range(60, 90))


def make_trainer(tmp_path, epochs, **kw):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, deterministic=True, **kw)


def fit_tiny(model, tmp_path, tiny_data):
    """Six epochs of ``Trainer.fit`` on ``tiny_data`` (``last.ckpt`` kept in ``tmp_path``): the vali
    batch, its scores after and NDCG@10 before and after."""
    train, val = tiny_data
    vb = val.padded()
    with torch.no_grad():
        before = ndcg(model.eval()(vb.features, vb.mask), vb.labels, mask=vb.mask, k=10).mean()
    model.train()
    trainer = make_trainer(tmp_path, 6, callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
    trainer.fit(model, datamodule=RankingDataModule.from_datasets(train, val, max_docs=128))
    model.eval()
    with torch.no_grad():
        scores = model(vb.features, vb.mask)
        return vb, scores, before, ndcg(scores, vb.labels, mask=vb.mask, k=10).mean()


def test_the_transformer_trains_from_the_module_options_and_checkpoints(tmp_path, tiny_data):
    train, val = tiny_data
    pl.seed_everything(0, verbose=False)
    model = LambdaRank(n_features=F, architecture="transformer", hidden=[16], heads=2, layers=1, lr=1e-2,
                       noise=0.1, dropout=0.0)
    assert isinstance(model.scorer, TransformerScorer) and model.scorer.preprocess.noise == 0.1
    vb, scores, before, after = fit_tiny(model, tmp_path, tiny_data)
    assert after > before + 0.05
    restored = LambdaRank.load_from_checkpoint(tmp_path / "last.ckpt").eval()
    with torch.no_grad():
        torch.testing.assert_close(restored(vb.features, vb.mask), scores)
        n = int(val.sizes[0])
        torch.testing.assert_close(restored(val.features[:n]), scores[0, :n])  # one query [L, F]


class Bare(torch.nn.Module):
    """A user's list-aware scorer that does not record its width."""

    list_aware = True

    def __init__(self, n):
        super().__init__()
        self.linear = torch.nn.Linear(n, 1)

    def forward(self, x, mask):
        s = self.linear(x).squeeze(-1)
        centre = (s * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
        return s - centre


def test_the_module_remembers_the_feature_count_it_trained_on(tmp_path, tiny_data):
    train, val = tiny_data
    pl.seed_everything(0, verbose=False)
    model = RankNet(scorer=Bare(F), lr=1e-2)
    assert model.n_features is None
    trainer = make_trainer(tmp_path, 1, callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
    trainer.fit(model, datamodule=RankingDataModule.from_datasets(train, val, max_docs=128))
    assert model.n_features == F
    export_torchscript(model, tmp_path / "m.pt")  # no n_features= needed
    restored = RankNet.load_from_checkpoint(tmp_path / "last.ckpt", scorer=Bare(F))
    assert restored.n_features == F
    export_program(restored, tmp_path / "m.pt2")
    x, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(load_scorer(tmp_path / "m.pt2", trust_torchscript=True)(x, mask),
                                   restored.eval()(x, mask))


def test_a_neural_rankers_scorer_is_built_from_its_settings():
    from rankkit.neural.config import NeuralConfig
    from rankkit.scorers import FeaturePreprocessor, MLPScorer, TransformerScorer, neural_scorer

    assert isinstance(neural_scorer(NeuralConfig(n_features=4)), MLPScorer)
    transformer = neural_scorer(NeuralConfig(n_features=4, architecture="transformer", noise=0.5))
    assert isinstance(transformer, TransformerScorer)
    assert {m.noise for m in transformer.modules() if isinstance(m, FeaturePreprocessor)} == {0.5}
    given = torch.nn.Linear(4, 1)
    assert neural_scorer(NeuralConfig(scorer=given)) is given
    with pytest.raises(ValueError, match="`scorer` has to be an nn.Module"):
        neural_scorer(NeuralConfig(scorer="mlp"))
    with pytest.raises(ValueError, match="pass `n_features`"):
        neural_scorer(NeuralConfig())
    with pytest.raises(ValueError, match="has none"):
        neural_scorer(NeuralConfig(scorer=given, noise=0.1))


def test_preprocessors_fitted_streamed_or_whole_agree_and_only_the_unfitted_are_fitted():
    from rankkit.scorers import FeaturePreprocessor, MLPScorer, fit_preprocessors

    x = torch.randn(500, 4, generator=torch.Generator().manual_seed(0)).exp()
    whole, streamed = MLPScorer(4, (8,)), MLPScorer(4, (8,))
    assert fit_preprocessors([whole], x) and fit_preprocessors([streamed], lambda: iter(x.split(64)))
    pre = [m for m in whole.modules() if isinstance(m, FeaturePreprocessor)]
    pre_streamed = [m for m in streamed.modules() if isinstance(m, FeaturePreprocessor)]
    assert len(pre) == 1
    for (key, a), b in zip(pre[0].state_dict().items(), pre_streamed[0].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
    assert not fit_preprocessors([whole], x * 100)  # fitted already: left as it is
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in pre]
    assert fit_preprocessors([whole], x * 100, refit=True)
    after = [m.state_dict() for m in pre]
    assert any(not torch.equal(b[k], a[k]) for b, a in zip(before, after) for k in b if b[k].is_floating_point())


# -- the piecewise-linear encoding ----------------------------------------------------------------
def heavy_tailed(n=400, seed=0):
    """Heavy-tailed columns with repeated values, a constant one, a binary one and missing values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g).mul(2).exp().round()  # many repeats (0, 1, 2, ...) and a long tail
    x[:, 1] = 3.0
    x[:, 2] = (x[:, 2] > 2).float()
    x[::7, 3] = float("nan")
    return x


def loop_codes(x, edges):
    """The encoding written out in float64, feature by feature and bin by bin."""
    n, f_count = x.shape
    bins = edges.shape[1] - 1
    out = torch.zeros(n, f_count, bins, dtype=torch.float64)
    for i in range(n):
        for f in range(f_count):
            v = float(x[i, f])
            v = 0.0 if v != v or abs(v) == float("inf") else v
            for t in range(bins):
                low, high = float(edges[f, t]), float(edges[f, t + 1])
                if high > low:
                    out[i, f, t] = min(max((v - low) / (high - low), 0.0), 1.0)
    return out


def test_the_piecewise_encoding_is_the_quantile_edges_and_the_formula_written_out():
    import numpy as np

    from rankkit.scorers import PiecewiseLinearEncoder

    x = heavy_tailed()
    encoder = PiecewiseLinearEncoder(4, bins=6, dim=3).fit(x)
    clean = np.nan_to_num(x.double().numpy(), nan=0.0)
    expected = np.quantile(clean, np.linspace(0, 1, 7), axis=0).T  # numpy's linear interpolation
    np.testing.assert_allclose(encoder.edges.numpy(), expected, rtol=1e-6)
    probe = torch.cat([x[:50], torch.tensor([[-1e9, 3.0, 5.0, 1e9], [float("inf"), 2.0, -1.0, float("nan")]])])
    codes = encoder.encode(probe)
    torch.testing.assert_close(codes.double(), loop_codes(probe, encoder.edges.double()), rtol=1e-6, atol=1e-7)
    assert codes[:, 1].abs().sum() == 0  # the constant feature: every bin has width 0
    with torch.no_grad():
        manual = torch.relu(torch.einsum("nft,ftd->nfd", codes, encoder.weight) + encoder.bias).flatten(1)
        torch.testing.assert_close(encoder(probe), manual)
        torch.testing.assert_close(encoder(probe.reshape(2, 26, 4)), manual.reshape(2, 26, 12))


def test_the_piecewise_edges_streamed_whole_sampled_or_across_processes_agree():
    from rankkit.scorers import PiecewiseLinearEncoder, fit_preprocessors

    x = heavy_tailed(1000, seed=1)
    whole = PiecewiseLinearEncoder(4, bins=8).fit(x)
    streamed = PiecewiseLinearEncoder(4, bins=8).fit_stream(lambda: iter(x.split(93)))
    torch.testing.assert_close(streamed.edges, whole.edges)
    # at most `sample` rows, every stride-th of the stream, the same rows either way
    sampled = PiecewiseLinearEncoder(4, bins=8, sample=300).fit(x)
    sampled_stream = PiecewiseLinearEncoder(4, bins=8, sample=300).fit_stream(lambda: iter(x.split(93)))
    torch.testing.assert_close(sampled_stream.edges, sampled.edges)
    torch.testing.assert_close(sampled.edges, PiecewiseLinearEncoder(4, bins=8).fit(x[::4]).edges)
    assert not torch.equal(sampled.edges, whole.edges)
    # two processes: each places edges on its rows, the edges are averaged weighted by the rows
    # (``reduce`` sums); a process without rows adds nothing but still joins the reduction
    other = PiecewiseLinearEncoder(4, bins=8).fit(x[:300] * 3).edges
    joined = []

    def reduce(t):
        joined.append(t)
        return t + torch.cat([other.reshape(-1) * 300, t.new_full((1,), 300.0)]).to(t.dtype)

    two = PiecewiseLinearEncoder(4, bins=8).fit_stream(lambda: iter(x.split(93)), reduce=reduce)
    torch.testing.assert_close(two.edges, (whole.edges * 1000 + other * 300) / 1300)
    alone = PiecewiseLinearEncoder(4, bins=8).fit_stream(lambda: iter([]), reduce=reduce)
    assert len(joined) == 2
    torch.testing.assert_close(alone.edges, other)
    with pytest.raises(ValueError, match="expected 4 features, got 5"):
        PiecewiseLinearEncoder(4).fit_stream(lambda: iter([torch.zeros(3, 5)]))
    scorer = MLPScorer(4, (8,), encoding="piecewise", bins=8)
    assert not scorer.preprocess.is_fitted
    assert fit_preprocessors([scorer], lambda: iter(x.split(93)))
    torch.testing.assert_close(scorer.preprocess.edges, whole.edges)
    assert not fit_preprocessors([scorer], x * 100)  # fitted already
    with pytest.raises(ValueError, match="no documents"):
        PiecewiseLinearEncoder(4).fit_stream(lambda: iter([]))


def test_an_unfitted_piecewise_encoder_passes_its_inputs_on():
    # Lightning's sanity check validates before training fits the edges: zero edges gave every
    # document the same score and no gradient to the encoder.
    from rankkit.scorers import PiecewiseLinearEncoder

    encoder = PiecewiseLinearEncoder(3, bins=4, dim=2)
    assert not encoder.is_fitted
    torch.testing.assert_close(encoder.edges, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]).repeat(3, 1))
    x = torch.rand(6, 3, generator=torch.Generator().manual_seed(0))
    assert len({round(float(v), 6) for v in MLPScorer(3, (8,), encoding="piecewise", bins=4)(x)}) == 6
    encoder(x).sum().backward()
    assert encoder.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("ext", list(EXPORTERS))
@pytest.mark.parametrize("architecture", ["mlp", "transformer"])
def test_every_export_of_a_piecewise_scorer_equals_eager(tmp_path, ext, architecture):
    if ext == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    scorer = (transformer(encoding="piecewise", bins=5) if architecture == "transformer"
              else MLPScorer(F, (8,), encoding="piecewise", bins=5).eval())
    scorer.preprocess.fit(torch.randn(200, F).mul(2).exp().round())
    path = EXPORTERS[ext](scorer, tmp_path / f"m.{ext}")
    served = load_scorer(path, trust_torchscript=True)
    for seed, (q, length) in enumerate([(3, 7), (1, 1), (5, 12)]):
        x, mask = batch(seed, q, length)
        x[0, 0, 0] = float("nan")
        with torch.no_grad():
            if architecture == "mlp":  # a pointwise export takes rows [N, F]
                torch.testing.assert_close(served(x[mask]), scorer(x[mask]), rtol=1e-5, atol=1e-5)
                continue
            torch.testing.assert_close(served(x, mask), scorer(x, mask).masked_fill(~mask, 0.0), rtol=1e-5, atol=1e-5)


def test_a_piecewise_ranker_fits_its_edges_on_the_training_documents_and_checkpoints(tmp_path, tiny_data):
    from rankkit.scorers import PiecewiseLinearEncoder

    train, val = tiny_data
    pl.seed_everything(0, verbose=False)
    model = LambdaRank(n_features=F, encoding="piecewise", bins=6, hidden=[16], lr=1e-2, dropout=0.0)
    assert isinstance(model.scorer.preprocess, PiecewiseLinearEncoder) and not model.scorer.preprocess.is_fitted
    vb, scores, before, after = fit_tiny(model, tmp_path, tiny_data)
    torch.testing.assert_close(model.scorer.preprocess.edges,
                               PiecewiseLinearEncoder(F, bins=6).fit(train.features).edges)
    assert after > before + 0.05
    restored = LambdaRank.load_from_checkpoint(tmp_path / "last.ckpt").eval()
    assert restored.hparams.encoding == "piecewise" and restored.hparams.bins == 6
    with torch.no_grad():
        torch.testing.assert_close(restored(vb.features, vb.mask), scores)


@pytest.mark.parametrize("options, message", [
    (dict(encoding="quantile"), "`encoding` has to be one of"),
    (dict(encoding="piecewise", bins=1), "`bins`"),
    (dict(encoding="piecewise", bins=5000), "`bins` has to be an integer in 2..1024"),
    (dict(encoding="piecewise", noise=0.1), "`noise`"),
    (dict(encoding="piecewise", architecture="transformer", hidden=[8], heads=2, noise=0.1), "`noise`"),
])
def test_a_bad_encoding_is_refused_naming_its_argument(options, message):
    with pytest.raises(ValueError, match=message):
        LambdaRank(n_features=F, **options)


def test_a_process_without_training_documents_still_joins_the_preprocessings_reductions():
    # It raised before the reduction while the other processes waited in it (a hang under DDP).
    y = torch.randn(50, 4, generator=torch.Generator().manual_seed(3)).exp()
    other = FeaturePreprocessor(4)._transform(y.double())
    calls = []

    def reduce(t):  # the other process's sums: its statistics, then its centred squares
        calls.append(t.numel())
        if t.numel() == 5:
            return t + torch.cat([other.sum(0), other.new_tensor([50.0])])
        return t + (other - other.mean(0)).square().sum(0)

    pre = FeaturePreprocessor(4).fit_stream(lambda: iter([]), reduce=reduce)
    assert calls == [5, 4]
    whole = FeaturePreprocessor(4).fit(y)
    torch.testing.assert_close(pre.mean, whole.mean)
    torch.testing.assert_close(pre.std, whole.std)
    with pytest.raises(ValueError, match="no documents"):
        FeaturePreprocessor(4).fit_stream(lambda: iter([]))
