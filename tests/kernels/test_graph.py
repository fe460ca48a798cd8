"""The round as a CUDA graph (rankkit.kernels.graph): the first rounds eager, then one capture
and replays that hand back what the capture's round returned; a capture that fails gives one
warning and eager rounds. Under Triton's interpreter a stand-in capture records the round's
Triton launches without running them (and refuses any torch op on the way, as a real capture
refuses a sync) and a replay runs exactly those launches again, as a GPU replays a graph: the
Triton backend's static round then grows the eager run's trees, bit for bit, with its Python run
once. A non-static round is never captured; on a CUDA machine the real capture is taken."""
from __future__ import annotations

import warnings

import pytest
import torch

from rankkit.kernels.graph import RoundGraph


def _fake_capture(log):
    def capture(step, device):
        log.append("capture")
        result = step()
        return (lambda: log.append("replay")), result
    return capture


def test_the_first_rounds_are_eager_then_one_capture_and_replays():
    log, calls = [], []

    def step():
        calls.append(1)
        return object()

    graph = RoundGraph("cpu", warmup=2, capture=_fake_capture(log))
    first, second = graph(step), graph(step)
    assert len(calls) == 2 and log == [] and first is not second  # eager
    third = graph(step)
    assert log == ["capture", "replay"] and len(calls) == 3  # the capture runs step's Python once
    assert graph(step) is third and graph(step) is third  # replays: step's result, step not called
    assert log == ["capture", "replay", "replay", "replay"] and len(calls) == 3
    assert (graph.rounds, graph.replays, graph.failed) == (5, 3, None)
    assert RoundGraph("cpu", warmup=0).warmup == 1  # the first round always runs eagerly (it allocates)
    # Another shape (key): the graph is dropped, the warm-up and the capture start again.
    log.clear()
    graph(step, key="two eval sets")
    graph(step, key="two eval sets")
    graph(step, key="two eval sets")
    assert log == ["capture", "replay"] and (graph.rounds, graph.replays) == (3, 1) and len(calls) == 6


def test_a_capture_that_fails_warns_once_and_the_rounds_run_eagerly():
    calls = []

    def capture(step, device):
        raise RuntimeError("operation not permitted when stream is capturing")

    graph = RoundGraph("cpu", capture=capture)
    graph(lambda: calls.append("eager"))
    with pytest.warns(RuntimeWarning, match="RANKKIT_CUDA_GRAPH: the boosting round could not be captured.*"
                                            "not permitted when stream is capturing"):
        graph(lambda: calls.append("eager"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning is said once
        graph(lambda: calls.append("eager"))
    assert calls == ["eager"] * 3 and graph.replays == 0 and "RuntimeError" in graph.failed


_INTERPRETED = r"""
import json, os, sys
os.environ["RANKKIT_TRITON"] = "force"
os.environ["RANKKIT_CPU_KERNEL"] = "0"
import warnings
warnings.simplefilter("ignore")
import torch
import triton.runtime.interpreter as interp
from torch.utils._python_dispatch import TorchDispatchMode
from rankkit.boosting.engine import BoostingEngine, BoosterConfig
from rankkit.data import make_synthetic
from rankkit.kernels.graph import RoundGraph

FREE = {"view", "_unsafe_view", "alias", "as_strided", "expand", "t", "transpose", "permute", "unsqueeze",
        "squeeze", "select", "slice", "detach", "reshape", "split", "split_with_sizes", "unbind"}
class Refuse(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE:
            raise RuntimeError(f"{name} while capturing")
        return func(*args, **(kwargs or {}))

def capture(step, device):
    # Record the Triton launches without running them, refuse torch ops; replay = run the launches.
    launches, run = [], interp.InterpretedFunction.run
    interp.InterpretedFunction.run = lambda self, *a, **k: launches.append((self, a, k))
    try:
        with Refuse():
            result = step()
    finally:
        interp.InterpretedFunction.run = run
    def replay():
        for self, a, k in launches:
            run(self, *a, **k)
    return replay, result

data = make_synthetic(14, (2, 30), 6, seed=3)
valid = make_synthetic(5, (2, 30), 6, seed=4)
out = {}
for label, overrides in {"static": {}, "sampled": dict(subsample=0.8), "added": {}, "full": dict(k=None)}.items():
    for mode in ("eager", "graph"):
        engine = BoostingEngine(data.features, data.labels, data.sizes,
                                BoosterConfig(depth=3, min_data_in_leaf=2, seed=1, **{"k": 5, **overrides}))
        engine.add_eval_set(valid.features, valid.labels, valid.sizes)
        assert engine.backend.name == "triton"
        if mode == "graph":
            engine.round_state["graph"] = RoundGraph("cpu", capture=capture)
        trees = [engine.update()]
        after_first = engine.backend._workspace().allocations
        trees += [engine.update() for _ in range(1 if label == "added" else 4)]
        if label == "added":  # a second eval set after two rounds: a new shape, captured again
            engine.add_eval_set(data.features, data.labels, data.sizes)
            trees += [engine.update() for _ in range(4)]
        graph = engine.round_state.get("graph")
        out[f"{label}/{mode}"] = {
            "trees": [[t.features.tolist(), t.codes.tolist(), t.leaf_values.tolist(), t.gains.tolist()] for t in trees],
            "history": engine.history, "scores": engine.scores.tolist(), "static": engine._static,
            "allocations": [after_first, engine.backend._workspace().allocations],
            "graph": None if not graph else [graph.rounds, graph.replays, graph.failed]}
# Two engines on one backend (its workspace shared), rounds in turn, each with its own graph.
from rankkit.kernels.backends import TritonBackend
shared = TritonBackend("cpu")
pair = {}
for lr in (0.1, 0.3):
    pair[lr] = BoostingEngine(data.features, data.labels, data.sizes,
                              BoosterConfig(depth=3, min_data_in_leaf=2, k=5, seed=1, learning_rate=lr), backend=shared)
    pair[lr].add_eval_set(valid.features, valid.labels, valid.sizes)
    pair[lr].round_state["graph"] = RoundGraph("cpu", capture=capture)
grown = {lr: [] for lr in pair}
for _ in range(4):
    for lr, engine in pair.items():
        t = engine.update()
        grown[lr].append([t.features.tolist(), t.codes.tolist(), t.leaf_values.tolist()])
for lr, engine in pair.items():
    alone = BoostingEngine(data.features, data.labels, data.sizes,
                           BoosterConfig(depth=3, min_data_in_leaf=2, k=5, seed=1, learning_rate=lr))
    alone.add_eval_set(valid.features, valid.labels, valid.sizes)
    out[f"shared/{lr}"] = {"grown": grown[lr], "alone": [[t.features.tolist(), t.codes.tolist(),
                           t.leaf_values.tolist()] for t in (alone.update() for _ in range(4))],
                           "graph": engine.round_state["graph"]}
# Two eval sets, each with its own metric buffer (scoped by its scores): the Triton backend's
# quantized run (bit for bit the reference's trees) against the torch backend's.
other = make_synthetic(7, (2, 30), 6, seed=5)
for backend in ("triton", "torch"):
    engine = BoostingEngine(data.features, data.labels, data.sizes, BoosterConfig(
        depth=3, min_data_in_leaf=2, k=5, seed=1, quantized_grad=True), backend=backend)
    engine.add_eval_set(valid.features, valid.labels, valid.sizes)
    engine.add_eval_set(other.features, other.labels, other.sizes)
    out[f"two/{backend}"] = {"trees": [[t.features.tolist(), t.codes.tolist(), t.leaf_values.tolist()]
                                       for t in (engine.update() for _ in range(4))], "history": engine.history}
# The backend's first engine gone, the next one on it may replay its rounds.
import gc
pair.clear(); engine = None; gc.collect()
later = BoostingEngine(data.features, data.labels, data.sizes, BoosterConfig(depth=3, min_data_in_leaf=2, k=5, seed=1),
                       backend=shared)
later.round_state["graph"] = RoundGraph("cpu", capture=capture)
for _ in range(3):
    later.update()
out["shared/later"] = later.round_state["graph"].replays
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    pytest.importorskip("triton")
    from kernels.triton import interpreted_json

    return interpreted_json(tmp_path_factory, _INTERPRETED)


def test_a_replayed_static_round_grows_the_eager_runs_trees_bit_for_bit(interpreted):
    eager, graph = interpreted["static/eager"], interpreted["static/graph"]
    assert eager["static"] and graph["graph"] == [5, 4, None]  # round 1 eager, then the capture's replay and 3
    assert graph["trees"] == eager["trees"]
    assert graph["history"] == eager["history"] and graph["scores"] == eager["scores"]
    assert len({str(t[:2]) for t in eager["trees"]}) > 1  # the rounds grow different trees
    # Device memory flat from round 2 on: the workspace allocates in the first round only.
    first, last = eager["allocations"]
    assert first > 20 and last == first, eager["allocations"]
    # A row sample changes the document count every round: views of the largest round's memory.
    sampled = interpreted["sampled/eager"]["allocations"]
    assert sampled[1] - sampled[0] <= 5, sampled  # a round past every one before grows 5 buffers, once


def test_a_replayed_round_without_a_cutoff_grows_the_eager_runs_trees(interpreted):
    """k=None (NDCG over whole lists: every pair weighed, no top-k ranks) replays as captured."""
    eager, graph = interpreted["full/eager"], interpreted["full/graph"]
    assert graph["graph"] == [5, 4, None]
    assert graph["trees"] == eager["trees"] and graph["history"] == eager["history"]
    assert graph["scores"] == eager["scores"]
    assert eager["trees"] != interpreted["static/eager"]["trees"]  # k=None is another objective than k=5


def test_an_eval_set_added_later_is_a_new_round_captured_again(interpreted):
    eager, graph = interpreted["added/eager"], interpreted["added/graph"]
    assert graph["graph"] == [4, 3, None]  # since the new shape: one eager round, the capture, two replays
    assert graph["trees"] == eager["trees"] and graph["history"] == eager["history"]
    assert len(eager["history"]) == 2 and len(eager["history"]["valid_1"]["ndcg@10"]) == 4


@pytest.mark.parametrize("lr", ["0.1", "0.3"])
def test_engines_sharing_a_backend_run_their_rounds_eagerly(interpreted, lr):
    run = interpreted[f"shared/{lr}"]  # their buffers are the backend's: no graph for either
    assert run["graph"] is False and run["grown"] == run["alone"]
    assert interpreted["shared/later"] == 2  # once both are gone, the next engine on it replays


@pytest.mark.parametrize("options", [dict(subsample=0.8), dict(colsample=0.5), dict(bagging_temperature=1.0),
                                     dict(random_strength=0.5), dict(quantized_grad=True), dict(exact_newton=True),
                                     dict(objective="xendcg"), dict(objective="listmle"),
                                     dict(objective="pointwise"), dict(objective="_loss")])
def test_a_round_that_draws_on_the_host_or_runs_user_code_is_not_static(options):
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data import make_synthetic

    data = make_synthetic(6, (2, 9), 4, seed=0)
    if options.get("objective") == "_loss":  # a custom loss: the user's code may do anything
        options = dict(objective=lambda scores, labels, mask: (scores * mask).pow(2).sum(1))
    static = BoostingEngine(data.features, data.labels, data.sizes, BoosterConfig(depth=2))._static
    engine = BoostingEngine(data.features, data.labels, data.sizes, BoosterConfig(depth=2, **options))
    assert static and not engine._static


def test_two_eval_sets_on_the_triton_backend_score_as_the_torch_backends(interpreted):
    triton_run, torch_run = interpreted["two/triton"], interpreted["two/torch"]
    assert triton_run["trees"] == torch_run["trees"]  # quantized: bit for bit
    for name in ("valid_0", "valid_1"):
        got, want = (torch.tensor(r["history"][name]["ndcg@10"], dtype=torch.float64) for r in (triton_run, torch_run))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # the torch metric sums in float32
    assert triton_run["history"]["valid_0"] != triton_run["history"]["valid_1"]


def test_a_round_with_host_draws_is_not_static_and_never_replayed(interpreted):
    sampled = interpreted["sampled/graph"]
    assert not sampled["static"] and sampled["graph"][1] == 0
    assert sampled["trees"] == interpreted["sampled/eager"]["trees"]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.version.cuda is None, reason="needs a CUDA device")
def test_on_a_gpu_the_static_round_is_captured_and_grows_the_eager_trees(monkeypatch):
    pytest.importorskip("triton")
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data import make_synthetic

    data = make_synthetic(200, (2, 60), 12, seed=0)
    runs = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("RANKKIT_CUDA_GRAPH", switch)
        engine = BoostingEngine(data.features, data.labels, data.sizes, BoosterConfig(depth=6), device="cuda")
        engine.add_eval_set(data.features, data.labels, data.sizes)
        trees = [engine.update() for _ in range(6)]
        runs[switch] = ([(t.features.tolist(), t.codes.tolist(), t.leaf_values.tolist()) for t in trees],
                        engine.round_state.get("graph"))
    assert runs["1"][1].replays == 5 and runs["1"][1].failed is None, runs["1"][1]
    assert runs["0"][1] is False
    assert runs["1"][0] == runs["0"][0]


def test_the_switch_turns_the_graph_off():
    from rankkit.kernels.switches import read_switches

    assert read_switches({"RANKKIT_CUDA_GRAPH": "0"}).cuda_graph == "off"
    assert read_switches({}).cuda_graph == "auto"
    with pytest.raises(ValueError, match="RANKKIT_CUDA_GRAPH='sometimes'"):
        read_switches({"RANKKIT_CUDA_GRAPH": "sometimes"})
