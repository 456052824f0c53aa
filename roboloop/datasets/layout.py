"""On-disk layout of LeRobot datasets, v2.1 and v3.0.

v2.1 keeps one parquet and one mp4 per episode:
    meta/info.json  meta/episodes.jsonl  meta/episodes_stats.jsonl  meta/tasks.jsonl
    data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet
    videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4

v3.0 packs many episodes per file and indexes them from parquet metadata:
    meta/info.json  meta/stats.json  meta/tasks.parquet
    meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet
    data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet
    videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4

Every path a dataset's metadata names is resolved through `safe_join`, which refuses
absolute paths and `..` so that a hostile info.json or S3 key can never make us read or
write outside the dataset root.
"""

from __future__ import annotations

from pathlib import Path

# the path-safety helper lives with the other file-system rules; re-exported for dataset code
from roboloop.fsutil import UnsafePathError, check_relative  # noqa: F401

V20 = "v2.0"
V21 = "v2.1"
V30 = "v3.0"
V2_VERSIONS = (V20, V21)  # one parquet (and one mp4 per camera) per episode; same paths

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
V21_EPISODES_PATH = "meta/episodes.jsonl"
V21_EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"
V21_TASKS_PATH = "meta/tasks.jsonl"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

V30_TASKS_PATH = "meta/tasks.parquet"
V30_EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
V30_EPISODES_PATH = V30_EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
V30_DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
V30_VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"

DEFAULT_CHUNK_SIZE = 1000  # files per chunk directory
DEFAULT_DATA_FILE_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 200

# Columns every frame row carries besides the user's features.
ENV_STATE = "observation.environment_state"  # LeRobot's key for the scene's state (its ENV feature)
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def safe_join(root: Path, rel: str) -> Path:
    """Join a metadata-provided relative path under `root`, refusing anything that escapes it."""
    return root / Path(*check_relative(rel).parts)


def chunk_of(episode_index: int, chunks_size: int) -> int:
    return episode_index // chunks_size


def next_chunk_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """The (chunk, file) after this one: files fill a chunk directory, then a new chunk starts."""
    if file_index == chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
LFS_POINTER_MAX_BYTES = 1024  # pointers are ~130 bytes: oid, size


def is_lfs_pointer_bytes(head: bytes) -> bool:
    return len(head) <= LFS_POINTER_MAX_BYTES and head.startswith(LFS_POINTER_PREFIX)


def is_lfs_pointer(path: Path) -> bool:
    """A Git LFS pointer file where content should be (a repository cloned without `git lfs`)."""
    try:
        if path.stat().st_size > LFS_POINTER_MAX_BYTES:
            return False
        with open(path, "rb") as f:
            return is_lfs_pointer_bytes(f.read(LFS_POINTER_MAX_BYTES + 1))
    except OSError:
        return False
