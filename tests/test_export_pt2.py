"""rankkit.export's .pt2 loader: a deeply nested JSON, or a program torch refuses, is one line."""
from __future__ import annotations

import zipfile

import pytest


def test_deeply_nested_json_in_a_pt2_is_one_line(tmp_path):
    from rankkit.export import export_program, load_scorer
    from rankkit.neural import MLPScorer

    path = tmp_path / "s.pt2"
    export_program(MLPScorer(4, (3,)).eval(), path, n_features=4)
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    name = next(n for n in members if n.endswith(".json"))
    members[name] = b'{"config": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    bad = tmp_path / "nested.pt2"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    with pytest.raises(ValueError) as e:
        load_scorer(bad)
    assert "nested.pt2" in str(e.value) and "\n" not in str(e.value)


def test_a_pt2_torch_refuses_says_one_line_without_torchs_log(tmp_path, capfd):
    from rankkit.export import export_program, load_scorer
    from rankkit.neural import MLPScorer

    path = tmp_path / "s.pt2"
    export_program(MLPScorer(4, (3,)).eval(), path, n_features=4)
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    name = next(n for n in members if n.endswith("models/model.json"))
    import json

    program = json.loads(members[name])
    program["schema_version"] = {"major": 99, "minor": 0}  # torch logs a traceback, then refuses it
    members[name] = json.dumps(program).encode()
    bad = tmp_path / "refused.pt2"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    capfd.readouterr()
    with pytest.raises(ValueError, match=r"refused.pt2.*SerializeError: Serialized schema version"):
        load_scorer(bad)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
