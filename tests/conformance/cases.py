"""The conformance matrix: datasets as LeRobot's writer and real public datasets make them.

Each case builds one dataset and declares two verdicts: LeRobot 0.6.1's (measured by the
test, so a LeRobot upgrade that changes it fails loudly) and roboloop's. They agree except
where a case says why not: `superset` (roboloop reads what LeRobot 0.6.1 no longer does) or
`strict` (LeRobot reads it but training would break or silently learn garbage).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from roboloop.datasets import stats
from roboloop.datasets.generate import GenSpec, generate_v21

_MEASURING = bool(os.environ.get("ROBOLOOP_MEASURE_LEROBOT_ERRORS"))
TOP = "observation.images.top"
BASE = GenSpec(num_episodes=4, min_length=8, max_length=14, cameras={TOP: (32, 48)}, seed=11, noise=8)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], None]
    lerobot_accepts: bool
    roboloop_refuses: str | None = None  # the defect code roboloop must name, None = accepts
    superset: str = ""  # why roboloop accepts what LeRobot refuses
    strict: str = ""  # why roboloop refuses what LeRobot accepts
    # when LeRobot refuses: its exception type and a piece of its message naming the defect (measured)
    lerobot_error: tuple[str, str] = ("", "")

    def __post_init__(self) -> None:
        accepts = self.roboloop_refuses is None
        assert accepts == self.lerobot_accepts or (self.superset if accepts else self.strict), self.name
        assert self.lerobot_accepts or all(self.lerobot_error) or _MEASURING, f"{self.name}: say why LeRobot refuses it"

    def __str__(self) -> str:
        return self.name


# ---------------------------------------------------------------- editing helpers
def edit_json(path: Path, fn: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=4, ensure_ascii=False))


def edit_jsonl(path: Path, fn: Callable[[dict], dict | None]) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = [r2 for r in rows if (r2 := fn(r)) is not None]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))


def edit_parquets(root: Path, fn: Callable[[pa.Table], pa.Table]) -> None:
    for p in sorted((root / "data").rglob("*.parquet")):
        pq.write_table(fn(pq.read_table(p)), p)


def v21(spec: GenSpec = BASE, **changes) -> Callable[[Path], None]:
    def build(dst: Path) -> None:
        generate_v21(dst, spec.model_copy(update=changes), workers=1)
    return build


def then(first: Callable[[Path], None], *edits: Callable[[Path], None]) -> Callable[[Path], None]:
    def build(dst: Path) -> None:
        first(dst)
        for e in edits:
            e(dst)
    return build


def set_feature(key: str, **fields) -> Callable[[Path], None]:
    return lambda d: edit_json(d / "meta/info.json", lambda i: i["features"][key].update(fields))


def set_info(**fields) -> Callable[[Path], None]:
    return lambda d: edit_json(d / "meta/info.json", lambda i: i.update(fields))


# pytest marks for tests that call LeRobot's writer, loader or policies (its dependencies' warnings, not ours)
LEROBOT_QUIET = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
                 pytest.mark.filterwarnings("ignore::FutureWarning"),
                 pytest.mark.filterwarnings("ignore::UserWarning")]


# ---------------------------------------------------------------- LeRobot's own writer (v3.0)
def _writer_features(cameras: dict[str, tuple[int, int]], images: dict[str, tuple[int, int]],
                     depth: dict[str, tuple[int, int]], env_state: int, dims: tuple[int, int]) -> dict:
    s_dim, a_dim = dims  # state and action sizes
    feats: dict = {"observation.state": {"dtype": "float32", "shape": (s_dim,),
                                         "names": [f"j{i}.pos" for i in range(s_dim)]},
                   "action": {"dtype": "float32", "shape": (a_dim,), "names": [f"j{i}.pos" for i in range(a_dim)]}}
    if env_state:
        feats["observation.environment_state"] = {"dtype": "float32", "shape": (env_state,),
                                                  "names": [f"k{i}" for i in range(env_state)]}
    for key, (h, w) in cameras.items():
        feats[key] = {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
    for key, (h, w) in images.items():
        feats[key] = {"dtype": "image", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
    for key, (h, w) in depth.items():
        feats[key] = {"dtype": "video", "shape": (h, w, 1), "names": ["height", "width", "channels"],
                      "info": {"is_depth_map": True}}
    return feats


def lerobot_writer(cameras: dict[str, tuple[int, int]], images: dict[str, tuple[int, int]],
                   tasks: list[str], num_episodes: int = 3, use_videos: bool = True,
                   depth: dict[str, tuple[int, int]] | None = None, env_state: int = 0,
                   dims: tuple[int, int] = (6, 6)) -> Callable[[Path], None]:
    """LeRobot's `LeRobotDataset.create` + `add_frame`: `cameras` as video, `images` as PNGs in the parquet,
    `depth` as (H, W, 1) uint16 millimetre maps flagged `is_depth_map` (its 12-bit HEVC depth video),
    `env_state` values of observation.environment_state per frame (PushT-keypoints style; 0: none)."""
    depth = depth or {}

    def build(dst: Path) -> None:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        from tests.conformance.lerobot_side import _quiet

        s_dim, a_dim = dims
        feats = _writer_features(cameras, images, depth, env_state, dims)
        rng = np.random.default_rng(5)
        with _quiet():
            ds = LeRobotDataset.create("conformance/writer", fps=30, features=feats, root=dst, robot_type="so101",
                                       use_videos=use_videos)
            for e in range(num_episodes):
                for i in range(9 + 4 * e):
                    frame = {"observation.state": rng.normal(size=s_dim).astype(np.float32),
                             "action": rng.normal(size=a_dim).astype(np.float32), "task": tasks[e % len(tasks)]}
                    if env_state:  # on another scale than the state: normalising it wrongly shows
                        frame["observation.environment_state"] = (10 + 3 * rng.normal(size=env_state)) \
                            .astype(np.float32)
                    for key, (h, w) in {**cameras, **images}.items():
                        img = np.zeros((h, w, 3), np.uint8)
                        img[..., 0] = (np.arange(w) * 4 + i * 9) % 256
                        img[..., 1] = (np.arange(h)[:, None] * 5 + e * 40) % 256
                        img[..., 2] = 128
                        frame[key] = img
                    for key, (h, w) in depth.items():  # a tilted plane 0.4-1.4 m away, moving with the frame
                        mm = 400 + 9 * i + 60 * e + np.arange(w)[None, :] * 20 + np.arange(h)[:, None] * 7
                        frame[key] = mm.astype(np.uint16)[..., None]
                    ds.add_frame(frame)
                ds.save_episode()
            ds.finalize()
    return build


# ---------------------------------------------------------------- roboloop's own recorder (collect, rollouts)
def roboloop_recorder(num_episodes: int = 3) -> Callable[[Path], None]:
    """What `roboloop collect` writes for the -Vision- task: a camera, the state, and the privileged scene state as
    observation.environment_state (LeRobot's key for it)."""
    def build(dst: Path) -> None:
        from roboloop.datasets.writer import EpisodeWriterV21

        rng = np.random.default_rng(9)
        w = EpisodeWriterV21(dst, 30, ["q0", "q1", "qd0", "qd1"], ["dx", "dy"], {TOP: (32, 32)},
                             env_state_names=["red_x", "red_y", "tip_x", "tip_y"])
        for e in range(num_episodes):
            n = 8 + 3 * e
            w.add_episode(rng.normal(size=(n, 4)), rng.normal(size=(n, 2)),
                          {TOP: rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)}, UNICODE_TASKS[e % 2],
                          env_state=rng.normal(size=(n, 4)))
        tmp = w.close()
        assert tmp == dst
    return build


# ---------------------------------------------------------------- quirks and faults
def nested_state_names(d: Path) -> None:  # the Unitree G1 dataset: [[...26 names...]]
    set_feature("observation.state", names=[[f"joint_{i}" for i in range(6)]])(d)


def unknown_keys(d: Path) -> None:
    edit_json(d / "meta/info.json", lambda i: i.update(discarded_episode_indices=[7, 9], license="apache-2.0",
                                                        tools=None))
    set_feature("action", unit="rad", limits={"lo": -1, "hi": 1})(d)
    set_feature(TOP, extra_note="front camera")(d)


def float64_timestamps(d: Path) -> None:
    edit_parquets(d, lambda t: t.set_column(t.column_names.index("timestamp"), "timestamp",
                                            pc.cast(t["timestamp"], pa.float64())))


def int32_vector_feature(d: Path) -> None:
    """A hand-state column of int32[5] beside float32 state/action, with its stats."""
    key = "observation.hand_state"
    edit_json(d / "meta/info.json", lambda i: i["features"].update({key: {"dtype": "int32", "shape": [5],
                                                                          "names": [f"f{k}" for k in range(5)]}}))
    per_ep = {}
    for p in sorted((d / "data").rglob("*.parquet")):
        t = pq.read_table(p)
        vals = (np.arange(t.num_rows * 5).reshape(-1, 5) % 7).astype(np.int32)
        per_ep[int(t["episode_index"][0].as_py())] = stats.to_jsonable({"x": stats.vector_stats(vals, False)})["x"]
        pq.write_table(t.append_column(key, pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel()), 5)), p)
    edit_jsonl(d / "meta/episodes_stats.jsonl",
               lambda r: {**r, "stats": {**r["stats"], key: per_ep[r["episode_index"]]}})


def v20_layout(d: Path) -> None:
    """LeRobot v2.0: a dataset-level stats.json and no per-episode stats."""
    rows = [json.loads(line) for line in (d / "meta/episodes_stats.jsonl").read_text().splitlines()]
    agg = stats.aggregate([{k: {s: np.asarray(v) for s, v in f.items()} for k, f in r["stats"].items()}
                           for r in rows])
    (d / "meta/stats.json").write_text(json.dumps(stats.to_jsonable(agg)))
    (d / "meta/episodes_stats.jsonl").unlink()
    set_info(codebase_version="v2.0")(d)


def lfs_pointers(d: Path) -> None:
    for p in [p for p in d.rglob("*") if p.is_file()]:
        p.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{'0' * 64}\nsize {p.stat().st_size}\n")


def truncate(rel_glob: str, fraction: float = 0.6) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = sorted(d.glob(rel_glob))[1]
        p.write_bytes(p.read_bytes()[: int(p.stat().st_size * fraction)])
    return edit


def faststart_then_truncate(d: Path) -> None:
    """An mp4 with its index at the front (`-movflags faststart`) cut short: it still probes fine."""
    import av

    p = sorted(d.glob("videos/*/*/*.mp4"))[1]
    tmp = p.with_suffix(".fs.mp4")
    with av.open(str(p)) as inp, av.open(str(tmp), "w", options={"movflags": "faststart"}) as out:
        st = inp.streams.video[0]
        o = out.add_stream_from_template(st, opaque=True)
        for packet in inp.demux(st):
            if packet.dts is not None:
                packet.stream = o
                out.mux(packet)
    data = tmp.read_bytes()
    tmp.unlink()
    p.write_bytes(data[: int(len(data) * 0.6)])


def remove(rel_glob: str) -> Callable[[Path], None]:
    return lambda d: sorted(d.glob(rel_glob))[1].unlink()


def move_videos_dir(d: Path) -> None:
    shutil.move(d / "videos", d / "video")


def nan_in_action(d: Path) -> None:
    p = sorted((d / "data").rglob("*.parquet"))[2]
    t = pq.read_table(p)
    vals = np.asarray(t["action"].to_pylist(), dtype=np.float32)
    vals[3, 1] = np.nan
    i = t.column_names.index("action")
    pq.write_table(t.set_column(i, "action", pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel()), 6)), p)


WRITER_CAMS = {TOP: (32, 48), "observation.images.wrist": (24, 32)}
UNICODE_TASKS = ["pick up the red cube", "pousser le bloc à gauche – ü", "把杯子放到盘子上", "stack 🧱 on 🧱"]

CASES = [
    # ---- both accept
    Case("lerobot-writer: 2 video cameras, 3 tasks", lerobot_writer(WRITER_CAMS, {}, UNICODE_TASKS[:3]), True),
    Case("lerobot-writer: image features stored in parquet",
         lerobot_writer({}, {"observation.images.gripper": (24, 24)}, UNICODE_TASKS[:2], use_videos=False), True),
    Case("lerobot-writer: video + image-in-parquet + depth cameras, mixed resolutions",
         lerobot_writer({TOP: (32, 48)}, {"observation.image": (24, 24)}, UNICODE_TASKS[:2],
                        depth={"observation.images.depth": (24, 32)}), True),
    Case("lerobot-writer: video + image features, metadata quirks edited in",
         then(lerobot_writer({TOP: (32, 48)}, {"observation.images.gripper": (16, 16)}, UNICODE_TASKS[:2]),
              nested_state_names, set_info(robot_type=None), unknown_keys), True),
    Case("roboloop recorder: camera + observation.environment_state", roboloop_recorder(), True),
    Case("v2.1 names as a list", v21(), True),
    Case("v2.1 names as a dict of lists",
         then(v21(), set_feature("observation.state", names={"motors": [f"m{i}" for i in range(6)]})), True),
    Case("v2.1 names as a nested list (Unitree G1)", then(v21(), nested_state_names), True),
    Case("v2.1 names null", then(v21(), set_feature("observation.state", names=None),
                                 set_feature("action", names=None)), True),
    Case("v2.1 robot_type null", then(v21(), set_info(robot_type=None)), True),
    Case("v2.1 unknown keys in info.json and feature entries", then(v21(), unknown_keys), True),
    Case("v2.1 chunks_size 3, three chunks", v21(num_episodes=7, chunks_size=3), True),
    Case("v2.1 float64 timestamps", then(v21(), float64_timestamps), True),
    Case("v2.1 int32 feature column of shape [5]", then(v21(), int32_vector_feature), True),
    Case("v2.1 splits disagree with total_episodes", then(v21(), set_info(splits={"train": "0:3"})), True),
    Case("v2.1 unicode task strings", v21(tasks=tuple(UNICODE_TASKS)), True),
    Case("v2.1 image names height/width/channel",
         then(v21(), set_feature(TOP, names=["height", "width", "channel"])), True),
    Case("v2.1 video + image feature in parquet", v21(image_keys={"observation.images.gripper": (16, 16)}), True),
    # ---- roboloop reads more than LeRobot 0.6.1
    Case("v2.0 layout (stats.json, no episodes_stats.jsonl)", then(v21(), v20_layout), False,
         superset="LeRobot 0.6.1 dropped v2.0; roboloop computes per-episode stats from the data",
         lerobot_error=("ValueError", "codebase version 'v2.0', expected 'v2.1'")),
    Case("v2.1 without episodes_stats.jsonl", then(v21(), lambda d: (d / "meta/episodes_stats.jsonl").unlink()),
         False, superset="per-episode stats are computed from the data (LeRobot's converter needs the file)",
         lerobot_error=("FileNotFoundError", "meta/episodes_stats.jsonl")),
    # ---- both refuse; roboloop names the reason
    Case("cloned without Git LFS (pointer files)", then(v21(), lfs_pointers), False, "lfs_pointer",
         lerobot_error=("JSONDecodeError", "Expecting value: line 1 column 1")),  # names no file
    Case("truncated parquet", then(v21(), truncate("data/*/*.parquet")), False, "corrupt_file",
         lerobot_error=("ArrowInvalid", "Parquet magic bytes not found")),  # names no file
    Case("missing video file", then(v21(), remove("videos/*/*/*.mp4")), False, "missing_file",
         lerobot_error=("ValueError", "Number of episodes is not the same")),  # names no file
    Case("state shape disagrees with the data", then(v21(), set_feature("observation.state", shape=[7])), False,
         "schema", lerobot_error=("DatasetGenerationError", "An error occurred while generating the dataset")),
    Case("v3 videos under video/ instead of videos/",
         then(lerobot_writer(WRITER_CAMS, {}, UNICODE_TASKS[:1]), move_videos_dir), False, "misplaced_file",
         lerobot_error=("OfflineModeIsEnabled", "huggingface.co")),  # looks for the videos on the Hub
    # ---- LeRobot reads them; training would break or learn garbage
    Case("truncated mp4 with its index in front (faststart)", then(v21(), faststart_then_truncate), False,
         "corrupt_file", lerobot_error=("InvalidDataError", "Invalid data found when processing input")),
    Case("NaN in action", then(v21(), nan_in_action), True, "non_finite",
         strict="a NaN target makes the loss NaN at the first batch that holds it (and NaN quantile stats)"),
]
