"""`roboloop registry add NAME DIR`: a model folder trained outside the loop enters the registry with the lineage
that can be read from it; it is not promoted without evidence."""

from __future__ import annotations

import json

from roboloop.cli import main
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.registry import Registry
from roboloop.training.config import TrainConfig
from roboloop.training.train import train


def test_registry_add_registers_a_folder_with_its_lineage(tmp_path, capsys):
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=2, min_length=10, max_length=12, cameras={}, seed=6))
    ds = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    model = tmp_path / "model"
    train(TrainConfig(dataset=str(ds), output_dir=str(model), steps=2, max_tokens=256, checkpoint_every_steps=0,
                      with_video=False, model_overrides={"horizon": 4, "dim": 32, "head_dim_model": 32}))
    reg = tmp_path / "reg"
    capsys.readouterr()
    assert main(["registry", "add", "arm", str(model), "--registry", str(reg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1 and out["promoted"] is None
    lin = Registry(reg).lineage("arm", 1)
    assert lin["config"]["registered_from"] == str(model) and lin["dataset"]["path"] == str(ds)
    assert lin["metrics"]["weights_sha256"] and lin["dataset_md5"].endswith(".dir")
    assert main(["registry", "add", "arm", str(model), "--registry", str(reg)]) == 0  # same weights: reused
    assert json.loads(capsys.readouterr().out)["reused"] and Registry(reg).versions("arm") == [1]
    # asked to promote with no evaluation: refused with the reason, nothing crowned
    assert main(["registry", "add", "arm", str(model), "--registry", str(reg), "--promote"]) == 2
    assert "evaluate it before promoting" in capsys.readouterr().err
    assert Registry(reg).aliases("arm")[0].get("champion") is None
