"""rankkit.export.load_scorer fuzzed: mutated TorchScript and torch.export files load or raise
ValueError, never run code."""
from __future__ import annotations

from pathlib import Path

from fuzzing import FUZZ, artefacts, mutate, mutation
from hypothesis import given, settings
from hypothesis import strategies as st

from rankkit.export import load_scorer


def assert_scores_or_refuses(path: Path) -> None:
    try:
        scorer = load_scorer(path, trust_torchscript=True)
    except ValueError:
        return
    assert callable(scorer)


@FUZZ
@given(mutations=mutation)
def test_load_scorer_on_mutated_torchscript(folder, mutations):
    path = folder / "m.pt"
    path.write_bytes(mutate(artefacts()[".pt"], mutations))
    assert_scores_or_refuses(path)


@FUZZ
@given(mutations=mutation)
def test_load_scorer_on_mutated_program(folder, mutations):
    path = folder / "m.pt2"
    path.write_bytes(mutate(artefacts()[".pt2"], mutations))
    assert_scores_or_refuses(path)


MEMBERS = ["models/model.json", "data/weights/model_weights_config.json",
           "data/constants/model_constants_config.json", "data/weights/weight_0", "archive_format"]


@settings(FUZZ, max_examples=30)
@given(member=st.sampled_from(MEMBERS), mutations=mutation)
def test_load_scorer_on_program_with_mutated_members(folder, member, mutations):
    """Members damaged inside an archive whose checksums are right: past zipfile, into the checks."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(artefacts()[".pt2"])) as z:
        files = {info.filename: z.read(info) for info in z.infolist()}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, mutate(data, mutations) if name.endswith("/" + member) else data)
    path = folder / "members.pt2"
    path.write_bytes(out.getvalue())
    assert_scores_or_refuses(path)
