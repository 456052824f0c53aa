"""Every `ROBOLOOP_*` setting, in one place (pydantic-settings: read from the environment).

Settings are about *where* things run and live (endpoints, the registry, the cluster shape),
never about what a run computes: those are config fields, which land in lineage. Secrets and
endpoints come from here, never from flow parameters, so they never reach a log line or the UI.
Only the user-facing CLI and orchestration read them; torchrun ranks and simulator children get
a config file from `roboloop.entry` and read nothing from here.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class S3Settings(BaseSettings):
    """`ROBOLOOP_S3_*`: the S3-compatible store (credentials come from boto3's usual AWS_* variables)."""

    model_config = SettingsConfigDict(env_prefix="ROBOLOOP_S3_")

    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (default: AWS, or AWS_ENDPOINT_URL)")
    region: str = Field("us-east-1", description="region for the S3 client")
    max_pool_connections: int = Field(32, description="parallel S3 connections")
    connect_timeout_s: float = Field(10, gt=0, description="seconds to open a connection to the store")
    read_timeout_s: float = Field(60, gt=0, description="seconds a request may wait for the store's next bytes")
    max_attempts: int = Field(5, ge=1, description="tries of each S3 request (botocore's standard retries)")


class Settings(BaseSettings):
    """`ROBOLOOP_*`: where roboloop keeps things and how the cluster is shaped."""

    model_config = SettingsConfigDict(env_prefix="ROBOLOOP_")

    registry: str = Field(".roboloop/registry", description="model registry URI: a folder or s3://bucket/prefix")
    cache_dir: str = Field(".roboloop/cache", description="downloaded datasets and stage receipts")
    artifacts: str = Field("artifacts", description="root of stage outputs (datasets, models, evaluations)")
    nproc_per_node: int = Field(1, ge=1, description="training ranks on this node (Kubernetes job template)")
    nnodes: int = Field(1, ge=1, description="nodes in a training job (Kubernetes job template)")
    node_rank: int = Field(0, ge=0, description="this node's index in a training job")
    rdzv_endpoint: str | None = Field(None, description="host:port of the c10d rendezvous on node 0")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of failed ranks")
    run_id: str = Field("roboloop", description="the rendezvous id every node of one training job shares (the "
                        "Kubernetes template: the Job's name)")
    run_store: str | None = Field(None, description="s3://bucket/prefix where the nodes of a training job meet when "
                                  "they share no folder: node 0's config, the dataset, checkpoints, the final model "
                                  "(roboloop.training.runstore); set, a re-created job resumes from it")
    join_timeout_s: float = Field(3600, gt=0, description="how long a node other than 0 waits for node 0 to reach "
                                  "training (it may ingest and convert first)")
    collective_timeout_s: float = Field(600, gt=0, description="a rank waits this long for the others in a "
                                        "collective before it fails (a lost node: the run fails or restarts then)")
    control_plane_grace_s: float = Field(600, gt=0, description="how long a stage that waits on other runs rides "
                                         "out a Prefect API that fails (its server down or restarting, its database "
                                         "down) before it gives up; the runs it waits on keep going meanwhile")
    store_grace_s: float = Field(600, gt=0, description="how long node 0 keeps trying to put a finished model in "
                                 "the run store while the store fails, before the job fails (a model that never "
                                 "reached the store is never reported delivered)")
    hang_timeout_s: float = Field(60, gt=0, description="a rank inside one training step for longer than this (or 10 "
                                  "times its median step, if more) is taken as hung and killed by its node's other "
                                  "ranks, so that torchrun restarts them (roboloop.training.hang)")
    peak_tflops: float | None = Field(None, gt=0, description="peak TFLOP/s for MFU where the device is unknown")
    serve_token_file: str = Field(".roboloop/serve-token", description="the policy server's token (mode 600; "
                                  "created by the server's first start, read by its clients)")
    policy_families: str = Field("", description="policy families beyond the built-in and installed ones that "
                                 "recipes and model folders may name: comma-separated 'package.module:Class' (a "
                                 "model folder never chooses code to import; roboloop.policies.trust)")
    warm_workers: int = Field(1, ge=0, description="idle warm workers a process keeps for its simulator stages "
                              "(evaluate, collect; roboloop.warm); 0: every stage starts a new interpreter")
    demo_preset: str = Field("demo", description="the loop preset `make demo` runs (demo or ci)")


def settings() -> Settings:
    return Settings()
