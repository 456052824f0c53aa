"""What one pass of the closed loop produced, as `make demo` prints it and the report artifact shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from roboloop.receipts import Decision, EvalSummary, ModelRef, OfflineSummary
from roboloop.serving.check import ServedCheck, serve_ref
from roboloop.training.runline import run_line


class RoundResult(BaseModel):
    """One pass of the loop: round 0 trains on the source; a DAgger round r > 0 on the data of round r-1 plus the
    expert's labels at the states round r-1's policy visited; an RL round fine-tunes the previous round's model in
    the simulator (its data columns are that model's)."""

    model_config = ConfigDict(frozen=True)

    round: int
    kind: Literal["demonstrations", "dagger", "rl"] = "demonstrations"
    dataset_md5: str
    episodes: int = Field(description="episodes in the data this round trained on")
    model: str
    weights_sha256: str
    success_rate: float
    ci_low: float
    ci_high: float
    successes: int
    evaluated: int
    version: int | None = None
    promoted: bool | None = None


class Candidate(BaseModel):
    """One model a training run left (a kept checkpoint or its final model), played on the validation episodes."""

    step: int
    model: str
    successes: int
    episodes: int
    success_rate: float
    ci_low: float
    ci_high: float
    eval_run: str


class Selection(BaseModel):
    """Which of a training run's models the loop carried on (`LoopConfig.select`), and what each scored on the
    validation episodes (`seed`, never the reported ones)."""

    model_config = ConfigDict(frozen=True)

    round: int
    seed: int
    episodes: int
    final_step: int
    picked_step: int
    picked_model: str
    candidates: list[Candidate] = Field(default_factory=list, description="empty: only the final model was there")

    def line(self) -> str:
        if not self.candidates:
            return (f"step {self.final_step} (the final model): no checkpoint was kept before it, nothing to pick "
                    "(train.checkpoint_every_steps, keep_last)")
        scores = ", ".join(f"{c.step}{' (final)' if c.step == self.final_step else ''}: {c.successes}/{c.episodes}"
                           for c in self.candidates)
        return (f"step {self.picked_step} of {self.final_step}, on {self.episodes} validation episodes (seed "
                f"{self.seed}): {scores}")


def plot_rounds(rounds: list[RoundResult], png: Path) -> Path:
    """Success (Wilson 95% CI) per round."""
    from roboloop import plots

    fig, ax = plots.subplots(figsize=(5, 3.2))
    plots.success_curve(ax, [r.round for r in rounds], [r.success_rate for r in rounds],
                        [r.ci_low for r in rounds], [r.ci_high for r in rounds])
    for r in rounds:
        ax.annotate("RL" if r.kind == "rl" else f"{r.episodes} eps", (r.round, r.success_rate),
                    textcoords="offset points", xytext=(6, -12), fontsize=7)
    ax.set_xticks([r.round for r in rounds])
    ax.set_xlabel("round (0: demonstrations; then DAgger" + (", RL" if rounds[-1].kind == "rl" else "") + ")")
    return plots.save(fig, png)


def training_line(m: dict) -> str | None:
    """The summary's word on training: steps and wall clock, precision, attention, device."""
    if not m.get("run"):
        return None
    took = f"{m['steps']} steps in {m['train_s'] / 60:.1f} min; " if m.get("train_s") is not None else ""
    return took + run_line(m["run"])


class LoopSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    dataset_v3: str
    dataset_md5: str
    model: str
    model_md5: str
    weights_sha256: str
    final_loss: float | None
    success_rate: float | None = Field(description="in simulation (None: evaluated offline)")
    ci: tuple[float, float] | None
    eval_run: str
    random_success_rate: float | None
    decision: Decision
    offline: OfflineSummary | None = Field(None, description="offline evaluation on held-out episodes")
    rounds: list[RoundResult] = Field(default_factory=list, description="every round's result (DAgger)")
    training: str | None = Field(None, description="the training run: steps and wall clock, precision, attention, "
                                 "device")
    selections: list[Selection] = Field(default_factory=list, description="the checkpoint each training's pick "
                                        "carried on (LoopConfig.select)")
    served: ServedCheck | None = Field(None, description="the registered version served and driven through its "
                                       "server (LoopConfig.serve_check)")

    def message(self) -> str:
        """The run's state message: the decision first, then the result it rests on."""
        d = self.decision
        verdict = ("promoted to champion" if d.promoted else "registered, gate not run" if d.promoted is None
                   else f"not promoted (champion stays v{d.champion})")
        if self.success_rate is not None and self.ci is not None:
            result = f"{self.success_rate:.1%} [{100 * self.ci[0]:.0f}, {100 * self.ci[1]:.0f}]"
            if self.random_success_rate is not None:
                result += f" vs random {self.random_success_rate:.0%}"
        else:
            result = f"offline mse_norm {self.offline.mse_norm:.4f}" if self.offline else "no evaluation"
        return _cut(f"{d.name} v{d.version}: {verdict}; {result}; {d.reason}")

    def markdown(self) -> str:
        d = self.decision
        loss = "n/a" if self.final_loss is None else f"{self.final_loss:.4f}"
        lines = ["## roboloop closed loop", "", "| stage | result |", "|---|---|",
                 f"| dataset | `{self.dataset_v3}` (md5 `{self.dataset_md5}`) |",
                 f"| model | `{self.model}` (final loss {loss}) |"]
        if self.training:
            lines.append(f"| training | {self.training} |")
        lines += [f"| checkpoint picked{f' (round {p.round})' if p.round else ''} | {p.line()} |"
                  for p in self.selections]
        if self.success_rate is not None and self.ci is not None:
            lines.append(f"| policy success | **{self.success_rate:.1%}** (95% CI {self.ci[0]:.1%}-{self.ci[1]:.1%}) |")
        if self.offline is not None:
            o = self.offline
            lines.append(f"| held-out episodes {o.episodes} | normalised action-chunk MSE **{o.mse_norm:.4f}** "
                         f"({o.samples} frames; no simulator) |")
            lines += [f"| baseline: {name.replace('_', ' ')} | normalised action-chunk MSE {b['mse_norm']:.4f} "
                      "(same frames) |" for name, b in sorted(o.baselines.items())]
        if self.random_success_rate is not None:
            lines.append(f"| random policy | {self.random_success_rate:.1%} |")
        lines.append(f"| registry | `{d.name}` v{d.version} in `{d.registry}`; promoted: {d.promoted} |")
        lines.append(f"| gate | {d.reason} |")
        if self.served is not None:
            lines.append(f"| served | {self.served.line()} |")
        if len(self.rounds) > 1:
            lines += ["", "| round | kind | episodes | success (95% CI) | registry |", "|---|---|---|---|---|"]
            lines += [f"| {r.round} | {r.kind} | {r.episodes} | {r.success_rate:.1%} "
                      f"({r.ci_low:.1%}-{r.ci_high:.1%}) | v{r.version}{' champion' if r.promoted else ''} |"
                      for r in self.rounds]
        return "\n".join(lines)

    def human(self) -> list[str]:
        """The lines `make demo` (and `roboloop loop`) print: where everything is, what it scored, what the gate
        decided and against which baseline."""
        r = self.decision
        out = [f"  dataset (v3, DVC md5 {self.dataset_md5}): {self.dataset_v3}",
               f"  model (weights sha256 {self.weights_sha256[:16]}): {self.model}",
               *([f"  training:            {self.training}"] if self.training else []),
               *[f"  checkpoint picked:   {p.line()}" + (f" (round {p.round})" if p.round else "")
                 for p in self.selections],
               f"  evaluation run:      {self.eval_run}" + (
                   "  (offline.json, open_loop.png)" if self.offline else "  (report.json, eval.png, videos/)"),
               f"  registry entry:      {r.name} v{r.version} in {r.registry} "
               f"({'champion' if r.promoted else 'not promoted'})",
               f"  gate:                {r.reason}"]
        if self.success_rate is not None and self.ci is not None:
            rnd = "n/a" if self.random_success_rate is None else f"{self.random_success_rate:.1%}"
            out.append(f"  success rate:        policy {self.success_rate:.1%} (95% CI {self.ci[0]:.1%}-"
                       f"{self.ci[1]:.1%})  vs random {rnd}")
        if self.offline is not None:
            o = self.offline
            base = ", ".join(f"{k.replace('_', ' ')} {b['mse_norm']:.4f}" for k, b in sorted(o.baselines.items()))
            out.append(f"  offline (held-out):  normalised action-chunk MSE {o.mse_norm:.4f} on episodes {o.episodes}"
                       + (f"  vs baselines: {base}" if base else ""))
        if self.served is not None:
            out.append(f"  served:              {self.served.line()}")
        if r.promoted or r.champion is not None:  # the next stage: the champion to robots (roboloop.serving)
            out.append(f"  serve the champion:  roboloop serve {serve_ref(r, 'champion')}  (follows promotions; robots "
                       "and simulators connect with roboloop robot / evaluate --policy serve://127.0.0.1:8765)")
        return out

    def report(self, elapsed_s: float) -> str:
        """What `make demo` and `roboloop loop` print at the end: the framed human lines, then the JSON line."""
        bar = "=" * 72
        return "\n".join([bar, f"closed loop finished in {elapsed_s:.0f} s", *self.human(), bar, self.json_line()])

    def json_line(self) -> str:
        """The summary as one JSON line (the last line `make demo` and `roboloop loop` print)."""
        import json

        d = self.model_dump(mode="json", exclude={"decision", "offline"})
        d |= {"registry_version": self.decision.version, "promoted": self.decision.promoted,
              "gate": self.decision.reason}
        if self.offline is not None:
            d |= {"offline_mse_norm": self.offline.mse_norm,
                  "offline_baselines": {k: b["mse_norm"] for k, b in self.offline.baselines.items()}}
        return json.dumps(d)


# One line per run for the Prefect runs list (a run's state message): what a person scanning runs needs.
MESSAGE_MAX = 240


def _cut(text: str, n: int = MESSAGE_MAX) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def eval_message(s: EvalSummary) -> str:
    """`reach-vla@3: 46/48 = 95.8% [86, 99], seed 0` (+ how it stopped early, + the worst perturbation)."""
    line = (f"{s.policy.removeprefix('registry:')}: {s.successes}/{s.episodes} = {s.success_rate:.1%} "
            f"[{100 * s.ci_low:.0f}, {100 * s.ci_high:.0f}], seed {s.seed}")
    if s.stopped_early:
        line += f", stopped early of {s.planned_episodes}"
    if s.reused:
        line = f"reused {Path(s.run_dir).name}: {line}"
    if s.perturbations:
        from roboloop.evaluation.perturb import worst

        w = worst(s.perturbations)
        line += f"; worst perturbation {w[0]}={w[1]}: {s.perturbations[w[0]][w[1]]['success_rate']:.0%}" if w else \
            "; no perturbation lowered it"
    return _cut(line)


def train_message(m: ModelRef) -> str:
    loss, steps = m.metrics.get("final_loss"), m.metrics.get("steps")
    return _cut(f"{Path(m.path).name}: final loss {loss:.4f} after {steps} steps" if loss is not None else
                f"{Path(m.path).name}: trained")


def decision_message(d: Decision) -> str:
    if d.promoted is None:
        return f"{d.name} v{d.version}: registered (gate not run)"
    verdict = "promoted to champion" if d.promoted else f"not promoted (champion stays v{d.champion})"
    return _cut(f"{d.name} v{d.version}: {verdict}; {d.reason}")
