"""Every command the README shows runs: its `rankkit ...` lines (with a 1-epoch cap and tiny
data where they train) and its Python examples (with fewer rounds/epochs)."""
from __future__ import annotations

import re
import shutil
import shlex
from pathlib import Path

import pytest

from rankkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def commands() -> list[list[str]]:
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("rankkit "):
                out.append(shlex.split(line)[1:])
    return out


def test_the_readme_starts_with_the_two_commands():
    first = blocks("bash")[0].split("\n")
    assert first[0].startswith("make demo") and first[1].startswith("make test")
    assert README.index("make demo") < README.index("## The main job")


@pytest.mark.slow
def test_every_rankkit_command_in_the_readme_runs(tmp_path, monkeypatch):
    from tests.test_cli import write_letor

    monkeypatch.chdir(tmp_path)
    for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        write_letor(tmp_path / name, seed)
    seen = set()
    ckpt = None
    for argv in commands():
        command = argv[0]
        seen.add(command)
        if "--data.data=mylog" in argv and not (tmp_path / "mylog").exists():  # "your own click log"
            from tests.training.test_datamodule import _click_log

            _click_log(tmp_path / "mylog")
        quick = [f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
        if command == "fit":
            argv = argv + quick + ["--trainer.max_epochs=1"]
        elif command in ("test", "validate"):
            argv = [a if not a.startswith("--ckpt_path") else f"--ckpt_path={ckpt}" for a in argv] + quick
        elif command in ("predict", "export"):
            models = [a for a in argv if a.startswith("PATH/TO/") and a.endswith(".ckpt")]
            for i, name in enumerate(models):  # several models: copies of the one checkpoint, as other files
                path = ckpt if i == 0 else tmp_path / f"copy{i}.ckpt"
                if i:
                    shutil.copyfile(ckpt, path)
                argv = [str(path) if a == name else a for a in argv]
        elif command == "tune":
            # the README's default data (every MQ2008 fold) writes results/tune/NAME; this data would
            # write NAME-DATA-fold1, so the folder the README's next command reads is named here
            argv = [*argv[:3], "--n_trials", "2", f"--data.data={tmp_path}", "--trainer.max_epochs=1",
                    "--out", f"results/tune/{argv[2]}"]
        elif command == "compare":
            argv = ["compare", "--data", str(tmp_path), "--max_epochs", "1", "--out", str(tmp_path / "cmp"),
                    *[a for a in argv[1:] if a == "--baselines"]]
        assert main(argv) == 0, argv
        if command == "fit":
            ckpt = sorted(tmp_path.rglob("*.ckpt"))[-1]
    assert {"fit", "test", "predict", "export", "compare", "tune"} <= seen
    assert (tmp_path / "scores.tsv").read_text().count("\n") == 24 * 12


@pytest.mark.slow
def test_every_python_example_in_the_readme_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    examples = blocks("python")
    assert len(examples) >= 2
    for code in examples:
        code = code.replace("max_epochs=30", "max_epochs=1").replace("n_estimators=300", "n_estimators=5")
        names = {"__name__": "readme"}
        exec(compile(code, "README.md", "exec"), names)
        assert "model" in names  # each example trains a model
    assert (tmp_path / "scorer.pt").stat().st_size > 0  # the first session's export


def test_the_defaults_table_is_the_code_and_the_configs():
    """The README's table of Python defaults against the shipped configs, cell by cell."""
    import inspect

    import yaml

    from rankkit.training.datamodule import RankingDataModule
    from rankkit.neural import LambdaRank, RankNet

    section = README[README.index("| argument | `LambdaRank` / `RankNet` default"):]
    rows = {}
    for line in section.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]

    def config(name):
        return yaml.safe_load((ROOT / "rankkit" / "configs" / f"{name}.yaml").read_text())

    def shown(value):
        return "None" if value is None else repr(value).replace("'", '"') if isinstance(value, str) else \
            str(value).replace("1e-05", "1e-5")

    for cls in (LambdaRank, RankNet):
        params = inspect.signature(cls.__init__).parameters
        for arg in ("hidden", "weight_decay", "k", "reduction", "encoding"):
            assert shown(params[arg].default) == rows[f"{arg}"][0], (cls, arg)
    for column, name in ((1, "lambdarank"), (2, "ranknet")):
        init = config(name)["model"]["init_args"]
        for arg in ("hidden", "weight_decay", "k", "reduction", "encoding"):
            expected = rows[arg][column]
            if expected == "(default)":
                assert arg not in init, (name, arg)
            else:
                assert shown(init[arg]) == expected, (name, arg, init.get(arg))
        assert str(config(name)["data"]["max_docs"]) == rows["RankingDataModule(max_docs=)"][column]
    assert str(inspect.signature(RankingDataModule.__init__).parameters["max_docs"].default) == \
        rows["RankingDataModule(max_docs=)"][0]


def test_the_gpu_pages_counted_and_modelled_launches_agree():
    """docs/gpu.md models a round with the launches it counts under the interpreter (it once
    modelled 45 on the page that counted 33 Triton launches plus 88 torch ops)."""
    page = (ROOT / "docs" / "gpu.md").read_text()
    row = re.search(r"^\| default \| (\d+) \| (\d+) \|", page, flags=re.M)
    modelled = re.search(r"^\| launches per round[^|]*\| (\d+) \|", page, flags=re.M)
    assert row and modelled, "docs/gpu.md lost its counted or modelled launches"
    assert int(modelled.group(1)) == int(row.group(1)) + int(row.group(2))


def test_every_generated_section_names_the_command_that_wrote_it():
    """A marked section (<!-- NAME:start --> ... <!-- NAME:end -->) of the README or docs/ quotes
    the command that regenerates it, and that command's script exists."""
    missing = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"<!-- ([a-z0-9_-]+):start -->(.*?)<!-- \1:end -->", text, flags=re.S):
            commands = re.findall(r"`((?:python|rankkit|make|bash)\b[^`]*)`", m.group(2))
            if not commands:
                missing.append(f"{path.name}:{m.group(1)}")
                continue
            for command in commands:
                script = re.match(r"python (experiments/\S+\.py)", command)
                if script and not (ROOT / script.group(1)).is_file():
                    missing.append(f"{path.name}:{m.group(1)}: {script.group(1)} does not exist")
    assert not missing, missing


def _regenerate_docs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("regenerate_docs", ROOT / "experiments" / "regenerate_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_docs_reruns_each_section_by_the_command_it_quotes():
    """`make docs` (experiments/regenerate_docs.py): every section it reruns names a script that
    writes sections, runnable as quoted; the ones it cannot rerun say why."""
    docs = _regenerate_docs()
    found = docs.sections()
    assert {s.how for s in found} <= {"writes", "demo", "gpu", "by hand"}
    assert sum(s.how == "writes" for s in found) >= 20, "sections lost their 'Command:'"
    for s in found:
        if s.how != "writes":
            continue
        argv = docs.runnable(s.command)
        script = ROOT / argv[1]
        assert script.is_file() and "\"--write\"" in script.read_text(), s  # its argparse takes --write
        assert "--write" in argv, s
    with pytest.raises(ValueError, match="placeholder"):
        docs.runnable("python experiments/mq2008_lambdamart.py --settings '<JSON>' --write")
    assert docs.runnable("PYTHONPATH=/tmp/x python experiments/a.py --write")[1:] == ["experiments/a.py", "--write"]


def test_make_docs_rewrites_the_readme_demo_table_and_keeps_its_prose(tmp_path, monkeypatch):
    docs = _regenerate_docs()
    readme = tmp_path / "README.md"
    readme.write_text(README)
    table = ("| model | NDCG@10 |\n|---|---:|\n| LambdaMART | 0.9999 |\n")

    def fake_compare(argv, **_):
        out = Path(argv[argv.index("--out") + 1])
        (out / "table.md").write_text("MQ2008, folds [1]: the protocol sentence.\n\n" + table)
    monkeypatch.setattr(docs.subprocess, "run", fake_compare)
    docs.regenerate_demo(readme)
    text = readme.read_text()
    section = text[text.index("<!-- demo:start -->"):text.index("<!-- demo:end -->")]
    assert table in section and "0.8141" not in section and "the whole run took" in section
    assert "One fold and one seed is a demo" in section  # the prose after the table
    assert text.replace(section, "") == README.replace(
        README[README.index("<!-- demo:start -->"):README.index("<!-- demo:end -->")], "")
