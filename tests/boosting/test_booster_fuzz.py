"""rankkit.boosting.booster.LambdaMART.load fuzzed: a mutated safetensors model loads or raises ValueError."""
from __future__ import annotations

from fuzzing import FUZZ, artefacts, mutate, mutation
from hypothesis import given

from rankkit.boosting import LambdaMART


@FUZZ
@given(mutations=mutation)
def test_lambdamart_load_on_mutated_safetensors(folder, mutations):
    path = folder / "m.safetensors"
    path.write_bytes(mutate(artefacts()[".safetensors"], mutations))
    try:
        model = LambdaMART.load(path)
    except ValueError:
        return
    assert isinstance(model, LambdaMART)
