"""Model registry: immutable versions with lineage, `champion`/`challenger` aliases, a promotion gate.

Backends: a local folder or S3 (`s3://bucket/prefix`, endpoint from ROBOLOOP_S3_ENDPOINT_URL),
chosen by the URI; default `$ROBOLOOP_REGISTRY` or `.roboloop/registry`.

Layout per model NAME:
    NAME/versions/v000001/claim.json       created with If-None-Match: the version number is ours
    NAME/versions/v000001/files/...        model files
    NAME/versions/v000001/lineage.json     git commit, dataset DVC md5, config, metrics, eval report
    NAME/versions/v000001/COMMITTED.json   written last: only committed versions exist
    NAME/aliases.json                      {"champion", "challenger", "decisions": [...]}, CAS-updated

A killed upload leaves a claim and some files but no COMMITTED.json, so it never appears as
a version. Alias updates are compare-and-swap (If-Match on the ETag read); a writer that
loses the race re-reads and decides again against the new champion, so concurrent promoters
serialise and no decision is lost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roboloop import fsutil
from roboloop.binomial import non_inferior, paired_difference, paired_error_gate, paired_gate
from roboloop.errors import RoboloopError
from roboloop.receipts import Decision
from roboloop.registry.files import model_files
from roboloop.registry.store import PreconditionFailed, open_store

REQUIRED_LINEAGE = ("git_commit", "dataset_md5", "config", "metrics")
ALIASES = ("champion", "challenger")


log = logging.getLogger(__name__)
_VERSION_KEY = re.compile(r"v(\d{6,})/(COMMITTED\.json|claim\.json)")
_warned: set[tuple[str, str]] = set()  # junk keys warned about once per process


class RegistryError(RoboloopError, ValueError):
    pass


class CorruptVersionError(RegistryError):
    """A version's metadata (lineage.json, COMMITTED.json, its eval report) cannot be trusted."""


def _check_eval(name: str, v: int, ev: Any) -> None:
    ok = isinstance(ev, dict)
    s, n = (ev.get("successes"), ev.get("episodes")) if ok else (None, None)
    if not ok or not isinstance(s, int) or not isinstance(n, int) or isinstance(s, bool) or not 0 <= s <= n or n < 1:
        raise CorruptVersionError(f"{name} v{v}: lineage.json's eval report is inconsistent "
                                  f"(successes={s!r}, episodes={n!r}); refusing to use it")


def _check_offline(name: str, v: int, off: Any) -> None:
    per = off.get("per_episode") if isinstance(off, dict) else None
    if not isinstance(per, dict) or not per or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
            for x in per.values()) or sorted(str(e) for e in off.get("episodes") or []) != sorted(per):
        raise CorruptVersionError(f"{name} v{v}: lineage.json's offline_eval is inconsistent (its per-episode "
                                  "errors do not match its episodes); refusing to use it")


def _offline_comparable(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """Scored on the same held-out episodes of the same dataset, with the same stride and noise seed."""
    if not old or not new.get("episodes"):
        return False
    return all(new.get(k) == old.get(k) for k in ("dataset_md5", "stride", "seed")) and \
        sorted(new["episodes"]) == sorted(old.get("episodes") or [])


def _verify(dst: Path, files: dict[str, dict]) -> bool:
    for rel, meta in files.items():
        p = dst / rel
        if not p.is_file() or p.stat().st_size != meta.get("bytes", p.stat().st_size) or \
                hashlib.sha256(p.read_bytes()).hexdigest() != meta["sha256"]:
            return False
    return True


def default_uri() -> str:
    from roboloop.settings import settings

    return settings().registry


def _vname(v: int) -> str:
    return f"v{v:06d}"


def parse_version(ref: str | int) -> int:
    s = str(ref).lstrip("v")
    if not s.isdigit():
        raise RegistryError(f"not a version: {ref!r} (use 3, v3 or an alias {ALIASES})")
    return int(s)


class Registry:
    def __init__(self, uri: str | Path | None = None):
        self.store = open_store(uri or default_uri())
        self.uri = self.store.uri

    # ------------------------------------------------------------------ versions
    def _vdir(self, name: str, v: int) -> str:
        return f"{name}/versions/{_vname(v)}"

    def _numbered(self, name: str, marker: str) -> list[int]:
        """Version numbers under NAME/versions/ that have `marker`; a key of another shape (junk written by hand or
        by another tool: `versions/vXYZ/COMMITTED.json`) is skipped with a warning, never fatal to every user."""
        found = set()
        for k in self.store.list(f"{name}/versions/"):
            if not k.endswith(f"/{marker}"):
                continue
            m = _VERSION_KEY.fullmatch(k.removeprefix(f"{name}/versions/"))
            if m is None or m.group(2) != marker:
                if (self.uri, k) not in _warned:
                    _warned.add((self.uri, k))
                    log.warning("registry %s: skipping %s (not a version's key: versions/vNNNNNN/%s)", self.uri, k,
                                marker)
                continue
            found.add(int(m.group(1)))
        return sorted(found)

    def versions(self, name: str) -> list[int]:
        return self._numbered(name, "COMMITTED.json")

    def models(self) -> list[str]:
        return sorted({k.split("/")[0] for k in self.store.list("")
                       if k.endswith("/COMMITTED.json") and _VERSION_KEY.fullmatch("/".join(k.split("/")[2:]))})

    def register(self, name: str, model_dir: str | Path, lineage: dict[str, Any]) -> int:
        """Upload `model_dir` as a new immutable version; returns its number. Lineage is required."""
        missing = [k for k in REQUIRED_LINEAGE if not lineage.get(k)]
        if missing:
            raise RegistryError(f"refusing to register {name}: lineage lacks {', '.join(missing)}")
        if lineage.get("eval") is not None:
            _check_eval(name, 0, lineage["eval"])  # never write what we would refuse to read
        if not name or "/" in name or name.startswith("."):
            raise RegistryError(f"bad model name {name!r}")
        src = Path(model_dir)
        files = model_files(src, RegistryError)
        if not files:
            raise RegistryError(f"{src}: no model files")
        from roboloop.policies.trust import UntrustedFolderError, check_processor_steps

        try:  # never write what a server would refuse to load
            check_processor_steps(src)
        except UntrustedFolderError as e:
            raise RegistryError(f"refusing to register {name}: {e}") from e
        v = (max(self._claimed(name), default=0)) + 1
        while True:  # claim the next free number (If-None-Match), racing other registrants
            try:
                self.store.put_bytes(f"{self._vdir(name, v)}/claim.json",
                                     json.dumps({"pid": os.getpid(), "time": time.time()}).encode(),
                                     if_none_match=True)
                break
            except PreconditionFailed:
                v += 1
        manifest = {}
        for p in files:
            rel = str(p.relative_to(src))
            self.store.put_file(f"{self._vdir(name, v)}/files/{rel}", p)
            manifest[rel] = {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size}
        self.store.put_bytes(f"{self._vdir(name, v)}/lineage.json", json.dumps(lineage, indent=2).encode())
        self.store.put_bytes(f"{self._vdir(name, v)}/COMMITTED.json",
                             json.dumps({"version": v, "files": manifest, "time": time.time()}).encode(),
                             if_none_match=True)
        return v

    def _claimed(self, name: str) -> list[int]:
        return self._numbered(name, "claim.json")

    def resolve(self, name: str, ref: str | int) -> int:
        if str(ref) in ALIASES:
            v = self.aliases(name)[0].get(str(ref))
            if v is None:
                known = self.models()
                raise RegistryError(f"{name} has no {ref} in the registry {self.uri}" + (
                    "" if name in known else f" (it holds {', '.join(known[:8]) or 'no models'})"))
            if int(v) not in self.versions(name):
                raise CorruptVersionError(f"{name}@{ref} points at v{v}, which is not a committed version "
                                          "(its COMMITTED.json is missing)")
            return int(v)
        v = parse_version(ref)
        if v not in self.versions(name):
            raise RegistryError(f"{name} has no committed version {v} in the registry {self.uri}")
        return v

    def _json(self, name: str, v: int, file: str) -> dict[str, Any]:
        """A version's metadata file, parsed and checked to be a JSON object; names the file when it is not."""
        got = self.store.get_bytes(f"{self._vdir(name, v)}/{file}")
        if got is None:
            raise CorruptVersionError(f"{name} v{v}: {file} is missing; the version cannot be used")
        try:
            doc = json.loads(got[0])
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptVersionError(f"{name} v{v}: {file} is corrupt ({e}); the version cannot be used") from e
        if not isinstance(doc, dict):
            raise CorruptVersionError(f"{name} v{v}: {file} is not a JSON object; the version cannot be used")
        return doc

    def lineage(self, name: str, ref: str | int) -> dict[str, Any]:
        v = self.resolve(name, ref)
        lin = self._json(name, v, "lineage.json")
        missing = [k for k in REQUIRED_LINEAGE if not lin.get(k)]
        if missing:
            raise CorruptVersionError(f"{name} v{v}: lineage.json lacks {', '.join(missing)}; refusing to use it")
        if lin.get("eval") is not None:
            _check_eval(name, v, lin["eval"])
        return lin

    def manifest(self, name: str, v: int) -> dict[str, dict]:
        committed = self._json(name, v, "COMMITTED.json")
        files = committed.get("files")
        if not isinstance(files, dict) or not all(isinstance(m, dict) and "sha256" in m for m in files.values()):
            raise CorruptVersionError(f"{name} v{v}: COMMITTED.json has no valid file manifest")
        return files

    def check(self, name: str) -> dict[int, str]:
        """Corrupt versions of `name` and why (the others are usable)."""
        bad = {}
        for v in self.versions(name):
            try:
                self.lineage(name, v)
                self.manifest(name, v)
            except CorruptVersionError as e:
                bad[v] = str(e)
        return bad

    def show(self, name: str, ref: str | int) -> dict[str, Any]:
        v = self.resolve(name, ref)
        al, _ = self.aliases(name)
        return {"name": name, "version": v, "aliases": [a for a in ALIASES if al.get(a) == v],
                "files": self.manifest(name, v), "lineage": self.lineage(name, v)}

    def download(self, name: str, ref: str | int, dst: str | Path, overwrite: bool = False) -> Path:
        """Copy a version's files to `dst` (verified against the manifest), atomically.

        `dst` must not exist, except as this same version downloaded earlier (verified, then reused)
        or, with `overwrite`, as another roboloop download (moved aside). Nothing else is touched.
        """
        v = self.resolve(name, ref)
        lineage = self.lineage(name, v)  # refuse versions without (valid) lineage
        files = self.manifest(name, v)
        dst = Path(dst).absolute()
        root = getattr(self.store, "root", None)
        if root is not None and (fsutil.inside(dst, root) or fsutil.inside(root, dst)):
            raise RegistryError(f"{dst} is inside (or contains) the registry {root}; download somewhere else (--dst)")
        me = {"registry": self.uri, "name": name, "version": v}
        marker = fsutil.read_marker(dst)
        if marker and {k: marker.get(k) for k in me} == me and _verify(dst, files):
            return dst  # already here, intact
        with fsutil.atomic_dir(dst, "model", overwrite, meta=me, flag="--dst") as tmp:
            for rel, meta in files.items():
                out = tmp / fsutil.check_relative(rel)
                self.store.get_file(f"{self._vdir(name, v)}/files/{rel}", out)
                if hashlib.sha256(out.read_bytes()).hexdigest() != meta["sha256"]:
                    raise CorruptVersionError(f"{name} v{v}: {rel} does not match its manifest checksum")
            (tmp / "lineage.json").write_text(json.dumps(lineage, indent=2))
        return dst

    # ------------------------------------------------------------------ aliases and promotion
    def aliases(self, name: str) -> tuple[dict[str, Any], str | None]:
        got = self.store.get_bytes(f"{name}/aliases.json")
        if got is None:
            return {"champion": None, "challenger": None, "decisions": []}, None
        try:
            doc = json.loads(got[0])
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise RegistryError(f"{name}/aliases.json in {self.uri} is corrupt ({e}); fix or remove it") from e
        return doc, got[1]

    def _cas_aliases(self, name: str, new: dict[str, Any], etag: str | None) -> None:
        data = json.dumps(new, indent=2).encode()
        if etag is None:
            self.store.put_bytes(f"{name}/aliases.json", data, if_none_match=True)
        else:
            self.store.put_bytes(f"{name}/aliases.json", data, if_match=etag)

    def promote(self, name: str, ref: str | int, margin: float = 0.05, alpha: float = 0.05,
                force: bool = False, rescore: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None
                ) -> Decision:
        """Make `ref` champion if it is not worse than the current one (paired over the same episodes when
        both were evaluated on the same task, seed and execution settings; else a two-proportion test on the
        eval reports in lineage); otherwise make it challenger and record why.

        A version evaluated offline only (no simulator) is compared on its held-out episodes, paired by
        episode; when the champion was not scored on those, `rescore(champion, offline_eval)` scores it
        there (without it the version is not promoted)."""
        v = self.resolve(name, ref)
        ev = self._eval(name, v)
        rescored: dict[int, dict[str, Any]] = {}
        for _attempt in range(200):
            al, etag = self.aliases(name)
            champ = al.get("champion")
            if champ is None:
                ok, reason = (True, "forced (no champion yet)") if force else _first_gate(ev, alpha)
            elif champ == v:
                ok, reason = True, "already champion"
            elif force:
                ok, reason = True, "forced"
            else:
                ok, reason = self._against(name, ev, int(champ), margin, alpha, rescore, rescored)
            now = time.time()
            d = Decision(registry=self.uri, name=name, version=v, promoted=ok, reason=reason,
                         champion=v if ok else champ, champion_before=champ, time=now)
            record = {"version": v, "promoted": ok, "reason": reason, "champion_before": champ,
                      "champion_after": d.champion, "time": now}
            new = {**al, "decisions": [*al.get("decisions", []), record]}
            if ok:
                new["champion"] = v
                if new.get("challenger") == v:
                    new["challenger"] = None
            else:
                new["challenger"] = v
            try:
                self._cas_aliases(name, new, etag)
                return d
            except PreconditionFailed:
                time.sleep(0.01 + 0.02 * (_attempt % 5))
        raise RegistryError(f"could not update {name}/aliases.json: too much contention")

    def _against(self, name: str, ev: dict[str, Any], champ: int, margin: float, alpha: float,
                 rescore: Callable[[int, dict[str, Any]], dict[str, Any]] | None,
                 rescored: dict[int, dict[str, Any]]) -> tuple[bool, str]:
        try:
            c = self._eval(name, champ)
        except CorruptVersionError as e:  # a corrupt champion must not block every promotion
            return True, f"champion v{champ} is unusable ({e})"
        if ("successes" not in ev or "successes" not in c) and ev.get("offline") and rescore and \
                not _offline_comparable(ev["offline"], c.get("offline")):
            if champ not in rescored:  # the champion scored on this version's held-out episodes
                rescored[champ] = rescore(champ, ev["offline"])
            c["offline"] = rescored[champ]
        return _gate(ev, c, margin, alpha)

    def _eval(self, name: str, v: int) -> dict[str, Any]:
        lin = self.lineage(name, v)  # eval validated by lineage()
        ev, off = lin.get("eval") or {}, lin.get("offline_eval")
        if off is not None:
            _check_offline(name, v, off)
        if "successes" not in ev or "episodes" not in ev:
            if off is not None:
                return {"offline": off}
            raise RegistryError(f"{name} v{v}: lineage has no eval report (successes, episodes) and no offline "
                                "evaluation; evaluate it before promoting")
        out: dict[str, Any] = {"successes": int(ev["successes"]), "episodes": int(ev["episodes"]),
                               **{k: ev.get(k) for k in ("task", "seed", "execute_steps", "perturbations", "latency",
                                                         "gate", "initial_states", "looks", "envelope")}}
        base = lin.get("baseline_eval")
        if isinstance(base, dict) and isinstance(base.get("successes"), int) and isinstance(base.get("episodes"), int):
            out["baseline"] = base
        if off is not None:
            out["offline"] = off
        o = ev.get("outcomes")
        if o is not None:
            if not isinstance(o, str) or set(o) - {"0", "1"} or len(o) != out["episodes"] or \
                    o.count("1") != out["successes"]:
                raise CorruptVersionError(f"{name} v{v}: lineage.json's eval outcomes disagree with its counts "
                                          f"({out['successes']}/{out['episodes']}); refusing to use them")
            out["outcomes"] = o
        return out


def _first_gate(ev: dict[str, Any], alpha: float) -> tuple[bool, str]:
    """No champion yet: the version must beat a baseline on the same episodes, with evidence (one-sided 1 - alpha):
    the random policy in simulation (paired by episode when both played numbered episodes of the same task and
    seed), the better trivial predictor offline (paired by held-out episode). Without a baseline it is not
    promoted: 'no champion yet' is no evidence that a model works."""
    if "successes" in ev:
        base = ev.get("baseline")
        if not base:
            return False, ("first version, and no baseline was evaluated on its episodes (evaluate the random policy "
                           "too, or promote with force): not promoted")
        return _beats_random(ev, base, alpha)
    off = ev.get("offline") or {}
    baselines = off.get("baselines") or {}
    if not baselines:
        return False, "first version, and no baseline was scored on its held-out episodes: not promoted"
    name, b = min(baselines.items(), key=lambda kv: kv[1]["mse_norm"])
    ok, why = paired_error_gate(off["per_episode"], b["per_episode"], margin=0.0, alpha=alpha)
    why = why.replace("challenger - champion", f"this - {name} baseline").replace("margin x champion", "0")
    verdict = "better than the baseline: champion" if ok else "not shown better than the baseline: not promoted"
    return ok, f"first version vs {name} baseline (mse_norm {b['mse_norm']:.4f}): {why}; {verdict}"


def _beats_random(ev: dict[str, Any], base: dict[str, Any], alpha: float) -> tuple[bool, str]:
    from statistics import NormalDist

    s, n, bs, bn = ev["successes"], ev["episodes"], base["successes"], base["episodes"]
    head = f"first version {s}/{n} vs {base.get('policy', 'random')} baseline {bs}/{bn}"
    same = same_episodes(ev, base, ("task", "seed"))
    if same and ev.get("outcomes") and base.get("outcomes"):
        z = NormalDist().inv_cdf(1 - alpha)
        r = paired_difference({i: c == "1" for i, c in enumerate(ev["outcomes"])},
                              {i: c == "1" for i, c in enumerate(base["outcomes"])}, margin=0.0, z=z)
        ok = r["ci_low"] > 0
        why = (f"paired over {r['episodes']} episodes: {r['diff']:+.3f}, {100 * (1 - alpha):.0f}% lower bound "
               f"{r['ci_low']:+.3f}")
    else:
        ok, _p, why = non_inferior(s, n, bs, bn, 0.0, alpha)
        why = f"unpaired: {why}"
    return ok, f"{head}, {why}: " + ("better than the baseline: champion" if ok else
                                     "not shown better than the baseline: not promoted")


def same_episodes(a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Two evaluation records played the same numbered episodes: the same task, seed (and execution), and, where
    both recorded them, the same initial states on the episodes both played (a changed task or scene draws other
    ones for the same seed; a random baseline plays the first episodes of the policy's)."""
    if not all(a.get(k) == b.get(k) and a.get(k) is not None for k in keys):
        return False
    x, y = a.get("initial_states"), b.get("initial_states")
    return not (x and y and x[:min(len(x), len(y))] != y[:min(len(x), len(y))])


def _gate(new: dict[str, Any], old: dict[str, Any], margin: float, alpha: float) -> tuple[bool, str]:
    """Paired when both runs played the same numbered episodes (task, seed, execution); else unpaired.
    Offline-only versions: paired over the held-out episodes both were scored on."""
    if "successes" not in new or "successes" not in old:
        if not _offline_comparable(new.get("offline") or {}, old.get("offline")):
            return False, ("not comparable: no simulator evaluation of both, and no offline scores on the same "
                           "held-out episodes; not promoted")
        return paired_error_gate(new["offline"]["per_episode"], old["offline"]["per_episode"], margin, alpha)
    same = same_episodes(new, old, ("task", "seed", "execute_steps"))
    looks = new.get("looks") if isinstance(new.get("looks"), int) and new["looks"] > 1 else None
    # the challenger's evaluation looked before its end: the last test spends what each look spent (the suites'
    # runs spend their own looks: robustness_and_latency gets the unspent alpha)
    nominal_alpha = alpha / looks if looks else alpha
    if same and new.get("outcomes") and old.get("outcomes"):
        ok, reason = paired_gate(new["outcomes"], old["outcomes"], margin, nominal_alpha)
        if looks:
            reason += f" (alpha {alpha:g}/{looks}: its evaluation looked {looks - 1} times before its end)"
    else:
        ok, _p, why = non_inferior(new["successes"], new["episodes"], old["successes"], old["episodes"], margin,
                                   nominal_alpha)
        reason = f"unpaired (not the same episodes): {why}"
    if not ok or not new.get("gate"):
        return ok, reason
    from roboloop.registry.checks import robustness_and_latency

    return robustness_and_latency(new, old, same, margin, alpha, reason)


def parse_ref(ref: str) -> tuple[str | None, str, str]:
    """`registry:NAME@ALIAS|VERSION` or `registry:URI#NAME@REF` -> (uri or None, name, ref)."""
    body = ref.removeprefix("registry:")
    uri = None
    if "#" in body:
        uri, body = body.split("#", 1)
    name, _, r = body.partition("@")
    if not name:
        raise RegistryError(f"not a registry reference: {ref!r} (use registry:NAME@champion or registry:NAME@3)")
    return uri, name, r or "champion"


def download_cache(reg: Registry) -> Path:
    """Where versions of `reg` are downloaded for use: <ROBOLOOP_CACHE_DIR>/registry/<its URI as a name>/NAME/vNNNNNN
    (downloaded once, verified at every use). A policy server keeps its own (ServeConfig.cache): it prunes the
    versions it no longer serves, which must never take a folder an evaluation is reading."""
    import re

    from roboloop.settings import settings

    label = re.sub(r"[^a-z0-9]+", "-", reg.uri.lower()).strip("-")[-48:]
    return Path(settings().cache_dir) / "registry" / f"{label}-{hashlib.sha256(reg.uri.encode()).hexdigest()[:8]}"


def fetch(ref: str, cache: Path | None = None) -> tuple[Path, Registry, str, int, str]:
    """The one resolver of `registry:NAME@ALIAS|VERSION` (optionally `registry:URI#NAME@REF`): the version it names,
    downloaded and verified into `cache` (default: `download_cache`) -> (folder, registry, name, version, the ref
    asked for)."""
    uri, name, r = parse_ref(ref)
    reg = Registry(uri)
    v = reg.resolve(name, r)
    folder = reg.download(name, v, (cache or download_cache(reg)) / name / _vname(v), overwrite=True)
    return folder, reg, name, v, r


def resolve_model_ref(ref: str) -> Path:
    """`registry:NAME@ALIAS|VERSION` (optionally `registry:URI#NAME@REF`) -> a local model folder (`fetch`)."""
    return fetch(ref)[0]
