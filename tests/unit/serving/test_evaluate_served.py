"""The simulator as the server's first robot: `--policy serve://HOST:PORT` gives the same episodes as the same
model in the Evaluator's own process (gym-pusht here; the Isaac Lab reach task in tests/isaac)."""

from __future__ import annotations

import pytest

from roboloop.evaluation.evaluator import evaluate
from roboloop.evaluation.policies import make_policy
from roboloop.serving.server import ServeConfig, Server
from roboloop.serving.token import read_token
from tests.models import untrained_model


def test_served_policy_plays_the_same_episodes_as_in_process(tmp_path, monkeypatch):
    pytest.importorskip("gym_pusht")
    from roboloop.sim.gym_env import GymVectorEnv

    monkeypatch.setenv("ROBOLOOP_SERVE_TOKEN_FILE", str(tmp_path / "token"))
    token = read_token(create=True)
    model = untrained_model(tmp_path / "m", 2, 2, 8, state_std=100.0, action_std=100.0,
                            cameras=("observation.image",))
    runs = {}
    with Server(ServeConfig(str(model), port=0), token) as srv:
        for spec in (str(model), f"serve://127.0.0.1:{srv.port}"):
            with GymVectorEnv("gym_pusht/PushT-v0", num_envs=2, seed=3, max_episode_steps=24) as env:
                policy = make_policy(spec, env)
                runs[spec[:5]] = evaluate(env, policy, episodes=4, execute_steps=4, videos=0, seed=3)[0]
    local, served = runs[str(model)[:5]], runs["serve"]
    assert served.episodes == local.episodes == 4
    keys = ("index", "env", "success", "length", "ret")
    assert [{k: e.get(k) for k in keys} for e in served.per_episode] == \
        [{k: e.get(k) for k in keys} for e in local.per_episode]
    assert any(e["ret"] != local.per_episode[0]["ret"] for e in local.per_episode)  # not a constant run
