"""Where the nodes of a training run meet when they share no folder: an S3 prefix, `ROBOLOOP_RUN_STORE`.

    s3://bucket/prefix/
      jobs/<run id>/join.json      node 0's word to the other nodes: the config, where the dataset is, the job's shape
      datasets/<fingerprint>/      the training dataset, uploaded once by node 0 (its `.roboloop-published.json` last)
      models/<name>-<key>/         the run's mirror: checkpoints/step-N/ (meta.json last) and the final model
                                   (model.safetensors last)

Every group of objects is written before the one object that says it is complete (a checkpoint's meta.json, the
model's weights, the dataset's marker), and an S3 PUT is whole or absent: a cut during a write leaves a group
without its last object, which no reader takes. Downloads are verified (sizes and ETags; a checkpoint also by the
sha256 of every file that its meta.json records) before anything uses them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from roboloop import s3 as s3mod
from roboloop.errors import RoboloopError

log = logging.getLogger(__name__)
PUBLISHED = ".roboloop-published.json"
CKPT = "checkpoints/step-"
MODEL_LAST = "model.safetensors"  # a finished model's last file


class RunStoreError(RoboloopError):
    pass


def store_url(required_for: str = "") -> str | None:
    """`ROBOLOOP_RUN_STORE` (s3://bucket/prefix), or None; with `required_for`, its absence is an error naming it."""
    from roboloop.settings import settings

    url = (settings().run_store or "").rstrip("/") or None
    if url and not s3mod.is_s3(url):
        raise RunStoreError(f"ROBOLOOP_RUN_STORE={url!r}: the run store is an s3://bucket/prefix every node reaches")
    if url is None and required_for:
        raise RunStoreError(f"{required_for} needs ROBOLOOP_RUN_STORE=s3://bucket/prefix: the nodes share no folder, "
                            "so they meet there (the config, the dataset, checkpoints and the model)")
    return url


def mirror_url(store: str, out: Path, cfg: Any, fingerprint: str) -> str:
    """The mirror of a run: its folder's name and a digest of what it computes (its keyed settings but the steps,
    which a resumed run may raise, and accumulate, which a run resumed on fewer ranks raises as they fall: the
    checkpoint's data slots are checked instead; and the dataset's content), so equal runs meet and different ones
    never do."""
    keyed = cfg.model_dump(mode="json", include=set(cfg.keyed_fields()) - {"steps", "accumulate"})
    digest = hashlib.sha256(json.dumps({**keyed, "dataset": fingerprint}, sort_keys=True).encode()).hexdigest()
    return f"{store}/models/{out.name}-{digest[:12]}"


class Prefix:
    """An S3 prefix: list, put, get, delete, with boto's errors as roboloop's."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.loc = s3mod.S3Uri.parse(self.url)
        self.c = s3mod.client()

    def keys(self, under: str = "") -> dict[str, s3mod.S3Object]:
        with s3mod.translated(f"listing {self.url}/{under}"):
            return {o.rel: o for o in s3mod.list_objects(self.c, self.loc) if o.rel.startswith(under)}

    def put_file(self, rel: str, path: Path) -> None:
        with s3mod.translated(f"writing {self.url}/{rel}"):
            self.c.upload_file(str(path), self.loc.bucket, self.loc.key(rel))

    def put_json(self, rel: str, doc: dict) -> None:
        with s3mod.translated(f"writing {self.url}/{rel}"):
            self.c.put_object(Bucket=self.loc.bucket, Key=self.loc.key(rel), Body=json.dumps(doc).encode())

    def get_json(self, rel: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            body = self.c.get_object(Bucket=self.loc.bucket, Key=self.loc.key(rel))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise s3mod.translate_error(e, f"reading {self.url}/{rel}") from e
        except Exception as e:
            raise s3mod.translate_error(e, f"reading {self.url}/{rel}") from e
        return json.loads(body)

    def delete(self, rels: list[str]) -> None:
        with s3mod.translated(f"deleting under {self.url}"):
            for rel in rels:
                self.c.delete_object(Bucket=self.loc.bucket, Key=self.loc.key(rel))

    def download(self, objects: list[s3mod.S3Object], dest: Path, strip: str = "") -> None:
        from roboloop.datasets.ingest import download_object

        with s3mod.translated(f"downloading {self.url}/{strip}"):
            for o in objects:
                download_object(self.c, self.loc.bucket, o, dest / o.rel[len(strip):])


# ---------------------------------------------------------------- the dataset, once per content
def publish_dataset(store: str, root: Path, fingerprint: str) -> str:
    """Upload the dataset at `root` under datasets/<fingerprint>/ unless it is there whole; returns its URL."""
    url = f"{store}/datasets/{fingerprint}"
    p = Prefix(url)
    if p.get_json(PUBLISHED) is not None:
        return url
    files = [f for f in sorted(root.rglob("*")) if f.is_file()
             and not any(part.startswith(".") for part in f.relative_to(root).parts)]
    for f in files:
        p.put_file(f.relative_to(root).as_posix(), f)
    p.put_json(PUBLISHED, {"fingerprint": fingerprint, "files": len(files), "time": time.time()})
    return url


def fetch_dataset(url: str, fingerprint: str, cache_dir: str | Path) -> Path:
    """The dataset node 0 published, downloaded (verified) into this node's cache; its content must be node 0's."""
    from roboloop.datasets.ingest import ingest
    from roboloop.training.outdir import dataset_fingerprint

    if Prefix(url).get_json(PUBLISHED) is None:
        raise RunStoreError(f"{url}: the dataset was never published whole (no {PUBLISHED})")
    path = ingest(url, cache_dir=cache_dir, strict=False).path
    if (got := dataset_fingerprint(path)) != fingerprint:
        raise RunStoreError(f"{url} downloaded to {path} has content {got}, not node 0's {fingerprint}")
    return path


# ---------------------------------------------------------------- node 0's word to the others
class JoinDoc(BaseModel):
    run_id: str
    config: dict[str, Any]  # node 0's TrainConfig; the dataset and output folder are each node's own
    dataset_url: str
    fingerprint: str
    nnodes: int
    nproc_per_node: int
    max_restarts: int
    rdzv_endpoint: str | None = None  # node 0's rendezvous, for nodes started without one (a Prefect pool's runs)
    finished: bool = False  # node 0 found the run finished (a retried job): the others have nothing to train


def publish_join(store: str, doc: JoinDoc) -> None:
    Prefix(f"{store}/jobs/{doc.run_id}").put_json("join.json", doc.model_dump(mode="json"))


def wait_join(store: str, run_id: str, timeout_s: float, poll_s: float = 2.0) -> JoinDoc:
    """Node 0's join document for `run_id`, waiting for it at most `timeout_s`."""
    p, deadline = Prefix(f"{store}/jobs/{run_id}"), time.monotonic() + timeout_s
    while (doc := p.get_json("join.json")) is None:
        if time.monotonic() > deadline:
            raise RunStoreError(f"no join document at {p.url}/join.json after {timeout_s:.0f} s: node 0 of run "
                                f"{run_id!r} never reached training (see its log)")
        time.sleep(poll_s)
    return JoinDoc.model_validate(doc)


# ---------------------------------------------------------------- a run's checkpoints and model
class Mirror(Prefix):
    """A run's output folder in S3: checkpoints (rank 0 pushes each one it writes) and the final model."""

    def checkpoint_steps(self) -> list[int]:
        """Steps of the whole checkpoints here (their meta.json, the last object written, is present)."""
        return sorted(int(rel[len(CKPT):].split("/")[0]) for rel in self.keys("checkpoints/")
                      if rel.endswith("/meta.json") and rel[len(CKPT):].split("/")[0].isdigit())

    def push_checkpoint(self, path: Path, keep_last: int, lead: bool = True, wait_s: float = 600.0) -> None:
        """Upload a checkpoint, meta.json last. A checkpoint the nodes wrote apart (its meta.json names the `whole`):
        each node pushes its own files; the lead (node 0) then waits until every file of the whole is here and
        writes the meta.json that lists them all, which makes the checkpoint whole in the store."""
        rel = f"checkpoints/{path.name}"
        files = sorted(f for f in path.rglob("*") if f.is_file() and f.name != "meta.json")
        for f in files:
            self.put_file(f"{rel}/{f.relative_to(path).as_posix()}", f)
        if not lead:
            return
        meta = json.loads((path / "meta.json").read_text())
        if "whole" in meta:
            self._await_files(rel, set(meta["whole"]), wait_s)
            meta = {**{k: v for k, v in meta.items() if k != "whole"}, "files": meta["whole"]}
        self.put_json(f"{rel}/meta.json", meta)  # last: it makes the checkpoint whole
        self._abort_older_uploads(int(path.name.removeprefix("step-")))
        if (rows := path.parent.parent / "metrics.jsonl").is_file():  # the loss curve so far, for a resumed run
            self.put_file("metrics.jsonl", rows)
        steps = self.checkpoint_steps()
        for old in steps[:-keep_last] if keep_last > 0 else []:
            prefix = f"{CKPT}{old:08d}/"
            keys = sorted(self.keys(prefix), key=lambda k: not k.endswith("/meta.json"))  # meta.json first
            self.delete(keys)

    def _abort_older_uploads(self, step: int) -> None:
        """Checkpoint `step` is whole here, so nobody writes it or an older one any more: an unfinished multipart
        upload under them is a killed or cut writer's, and is aborted (its parts would be stored, and billed, for
        ever)."""
        base = self.loc.key(CKPT)

        def abandoned(key: str) -> bool:
            folder = key[len(base):].split("/", 1)[0]
            return folder.isdigit() and int(folder) <= step

        with s3mod.translated(f"aborting unfinished uploads under {self.url}/checkpoints"):
            if dropped := s3mod.abort_uploads(self.c, self.loc.bucket, base, abandoned):
                log.warning("aborted %d unfinished multipart upload(s) of older checkpoints under %s: %s",
                            len(dropped), self.url, ", ".join(dropped[:3]))

    def _await_files(self, rel: str, wanted: set[str], wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while missing := sorted(wanted - {k[len(rel) + 1:] for k in self.keys(f"{rel}/")}):
            if time.monotonic() > deadline:
                raise RunStoreError(f"{self.url}/{rel}: the other nodes' parts never arrived within {wait_s:.0f} s "
                                    f"({len(missing)} files, e.g. {missing[0]}); the checkpoint is left incomplete")
            time.sleep(0.5)

    def pull_checkpoint(self, step: int, ckpt_dir: Path) -> Path:
        """Download checkpoint `step` into `ckpt_dir` (a temporary folder, verified, then renamed into place)."""
        from roboloop.errors import CorruptFileError
        from roboloop.training import checkpoint

        name = f"step-{step:08d}"
        final, tmp = ckpt_dir / name, ckpt_dir / f"{name}.tmp-pull-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        objects = list(self.keys(f"checkpoints/{name}/").values())
        self.download(objects, tmp, strip=f"checkpoints/{name}/")
        if why := checkpoint.damage(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorruptFileError(f"checkpoint {name} in {self.url} is not whole: {why}")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        rows = ckpt_dir.parent / "metrics.jsonl"
        if not rows.exists() and (found := self.keys("metrics.jsonl").get("metrics.jsonl")):
            self.download([found], ckpt_dir.parent)  # rows beyond the checkpoint are dropped when training resumes
        return final

    def push_model(self, out: Path) -> None:
        files = sorted(f for f in out.iterdir() if f.is_file() and not f.name.startswith(".")
                       and f.name != MODEL_LAST and not f.name.endswith((".lock", ".tmp")))
        for f in [*files, out / MODEL_LAST]:  # the weights last: their presence says the model is whole
            self.put_file(f.name, f)

    def deliver_model(self, out: Path, grace_s: float, on_line=print) -> bool:
        """`push_model`, unless the mirror holds this model already (every file there, of the same size); a store
        that fails is asked again, backing off to 30 s, for up to `grace_s`, then the error is raised. True: pushed."""
        files = [f for f in out.iterdir() if f.is_file() and not f.name.startswith(".")
                 and not f.name.endswith((".lock", ".tmp"))]
        t0, delay = time.monotonic(), 2.0
        while True:
            try:
                there = {rel: o.size for rel, o in self.keys().items() if "/" not in rel}
                if MODEL_LAST in there and all(there.get(f.name) == f.stat().st_size for f in files):
                    return False
                self.push_model(out)
                return True
            except Exception as e:  # noqa: BLE001 - the store's errors are many (botocore's, the network's)
                if time.monotonic() - t0 + delay > grace_s:
                    raise RunStoreError(f"the finished model in {out} could not be put in {self.url} for "
                                        f"{time.monotonic() - t0:.0f} s (ROBOLOOP_STORE_GRACE_S={grace_s:g}): {e}; "
                                        "run the job again to deliver it") from e
                on_line(f"the model could not be put in {self.url} ({type(e).__name__}: {str(e)[:200]}); "
                        f"trying again in {delay:.0f} s")
                time.sleep(delay)
                delay = min(2 * delay, 30.0)

    def pull_model(self, out: Path) -> bool:
        """A finished model of this run into the empty folder `out` (a re-created node 0 finds it); False if none."""
        objects = [o for rel, o in self.keys().items() if "/" not in rel]
        if not any(o.rel == MODEL_LAST for o in objects):
            return False
        tmp = out.with_name(f"{out.name}.tmp-pull-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.download(objects, tmp)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()  # empty (the caller checked)
        tmp.rename(out)
        from roboloop import fsutil
        from roboloop.training.outdir import KIND

        fsutil.atomic_write_json(out / fsutil.MARKER, {"created_by": "roboloop", "kind": KIND})
        return True


class Pusher:
    """Rank 0's uploads of its checkpoints, in a thread beside training (and, for checkpoints the nodes write apart,
    each other node's first rank's: `lead` False pushes its part only). Training never waits for the store: a save
    while a push is under way queues the new checkpoint, which replaces one still queued (only the newest is worth
    pushing; where the nodes write apart every one is pushed, so that each node pushes the same ones), and the
    checkpoints being pushed are pinned against pruning. Before, the next save waited for the previous push, and with
    a slow store the other ranks, waiting in their collective, timed out and the run died "having lost a node". A
    push that fails is said (the next checkpoint is pushed whole anyway); `wait()` at the end of training."""

    def __init__(self, mirror: Mirror, keep_last: int, lead: bool = True, coalesce: bool = True):
        self.mirror, self.keep_last, self.lead, self.coalesce = mirror, keep_last, lead, coalesce
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.queue: list[Path] = []
        self.pushed: list[str] = []
        self.failed: list[str] = []
        self.skipped: list[str] = []

    def submit(self, path: Path) -> None:
        from roboloop.training import checkpoint

        with self.lock:
            if self.coalesce:
                for old in self.queue:
                    checkpoint.unpin(old)
                    self.skipped.append(old.name)
                self.queue.clear()
                checkpoint.prune(path.parent, self.keep_last)
            checkpoint.pin(path)
            self.queue.append(path)
            if self.thread is None:
                self.thread = threading.Thread(target=self._drain, name="checkpoint-push", daemon=True)
                self.thread.start()

    def _drain(self) -> None:
        from roboloop.training import checkpoint

        while True:
            with self.lock:
                if not self.queue:
                    self.thread = None
                    return
                path = self.queue.pop(0)
            try:
                self._push(path)
            finally:
                checkpoint.unpin(path)
                checkpoint.prune(path.parent, self.keep_last)  # what the saves kept for it goes now

    def _push(self, path: Path) -> None:
        try:
            self.mirror.push_checkpoint(path, self.keep_last, lead=self.lead)
            self.pushed.append(path.name)
        except Exception as e:  # noqa: BLE001 - said, and the run goes on; the next checkpoint is pushed whole
            self.failed.append(path.name)
            print(f"checkpoint {path.name} was not mirrored to {self.mirror.url} ({e}); training goes on, the next "
                  "checkpoint will be pushed", flush=True)

    def wait(self) -> None:
        """Until every queued checkpoint is pushed (or failed)."""
        while True:
            with self.lock:
                t = self.thread
            if t is None:
                return
            t.join()
            with self.lock:
                if self.thread is t:  # it died without clearing itself (an exception that is not an Exception)
                    self.thread = None
