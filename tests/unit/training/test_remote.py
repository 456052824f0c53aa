"""Training on a pool's nodes (`roboloop.training.remote`), the parts around the nodes: the orchestrator's job in the
run store (moto's S3 server), the model it takes back, and what it refuses. The nodes themselves train on test hosts
in tests/cluster/test_cluster_loop.py."""

from __future__ import annotations

import json

import pytest

from roboloop import fsutil, stages
from roboloop.receipts import DatasetRef
from roboloop.training import launch as launcher
from roboloop.training import remote, runstore
from roboloop.training.config import LaunchConfig, TrainRecipe


@pytest.fixture
def store(s3_env, monkeypatch):
    from roboloop.s3 import client

    try:
        client().create_bucket(Bucket="runs")
    except Exception as e:  # the session's server keeps its buckets
        if "BucketAlready" not in type(e).__name__ + str(e):
            raise
    monkeypatch.setenv("ROBOLOOP_RUN_STORE", "s3://runs/remote-test")
    return "s3://runs/remote-test"


def test_a_deployment_launch_is_refused_where_no_flow_starts_the_nodes(tmp_path):
    data = DatasetRef(path=str(tmp_path), md5="0" * 32, format="v3.0", num_episodes=1, num_frames=1, fps=10)
    launch = LaunchConfig(nnodes=2, deployment="train-node/train-node")
    with pytest.raises(ValueError, match="launch.deployment='train-node/train-node' trains on a Prefect pool"):
        stages.train(data, TrainRecipe(steps=1), launch)


def test_the_job_publishes_the_dataset_once_and_names_the_mirror_the_nodes_train_into(store, small_v21, tmp_path):
    from roboloop.datasets.convert import ConvertConfig, convert

    v3 = convert(small_v21, tmp_path / "v3", ConvertConfig(progress=False))
    out = tmp_path / "models" / "tiny-abc"
    job = remote.prepare(v3, TrainRecipe(steps=5), LaunchConfig(nnodes=2), out, run_id="job-1")
    assert job.dataset_url == f"{store}/datasets/{job.fingerprint}" and job.nnodes == 2
    assert job.config["mirror"].startswith(f"{store}/models/tiny-abc-")
    assert runstore.Prefix(job.dataset_url).get_json(runstore.PUBLISHED)["fingerprint"] == job.fingerprint
    again = remote.prepare(v3, TrainRecipe(steps=9), LaunchConfig(nnodes=2), out, run_id="job-2")
    assert again.config["mirror"] == job.config["mirror"]  # more steps resume the same run's checkpoints
    params = remote.node_params(job, LaunchConfig(nnodes=2, collective_timeout_s=30))
    assert [p.node_rank for p in params] == [0, 1] and params[0].job == job and params[1].job is None
    # FSDP across nodes: each node's shards meet in the run store (tests/cluster/test_fsdp_hosts.py)
    sharded = remote.prepare(v3, TrainRecipe(steps=5, strategy="fsdp"), LaunchConfig(nnodes=2), out, run_id="job-3")
    assert sharded.config["strategy"] == "fsdp" and sharded.config["mirror"] != job.config["mirror"]


def test_the_model_comes_back_only_whole_and_never_over_a_folder_of_someone_else(store, tmp_path):
    job = runstore.JoinDoc(run_id="job-m", config={"mirror": f"{store}/models/m-1"}, dataset_url="", fingerprint="",
                           nnodes=2, nproc_per_node=1, max_restarts=0)
    out = tmp_path / "models" / "m"
    assert not remote.take_model(job, out)  # nothing trained yet
    trained = tmp_path / "node0" / "m"
    trained.mkdir(parents=True)
    (trained / "config.json").write_text("{}")
    (trained / "model.safetensors").write_bytes(b"weights")
    mirror = runstore.Mirror(job.config["mirror"])
    mirror.put_file("config.json", trained / "config.json")
    assert not remote.take_model(job, out)  # the weights are written last: without them the model is not whole
    mirror.push_model(trained)
    assert remote.take_model(job, out) and (out / "model.safetensors").read_bytes() == b"weights"
    assert remote.take_model(job, out)  # again: the earlier one of roboloop's is moved aside, not deleted
    assert len(list(out.parent.glob("m.replaced-*"))) == 1
    theirs = tmp_path / "models" / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="roboloop did not write"):
        remote.take_model(job, theirs)
    assert (theirs / "notes.txt").read_text() == "mine" and fsutil.read_marker(theirs) is None


def test_a_node_started_without_a_rendezvous_takes_node_0s_and_refuses_when_there_is_none(store, tmp_path):
    doc = runstore.JoinDoc(run_id="job-r", config={}, dataset_url="", fingerprint="", nnodes=2, nproc_per_node=1,
                           max_restarts=0)
    runstore.publish_join(store, doc)
    with pytest.raises(ValueError, match="node 0 named no rendezvous"):
        launcher.join(LaunchConfig(nnodes=2, node_rank=1, run_id="job-r"), tmp_path, tmp_path / "cache", 5)
    runstore.publish_join(store, doc.model_copy(update={"rdzv_endpoint": "node-0:29400"}))
    got = runstore.wait_join(store, "job-r", 5)
    assert got.rdzv_endpoint == "node-0:29400"
    assert json.loads(json.dumps(got.model_dump(mode="json")))["rdzv_endpoint"] == "node-0:29400"
