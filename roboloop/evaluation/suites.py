"""After the nominal evaluation: the same episodes under each perturbation (`--perturb`) and with the policy's latency
charged in simulated time (`--latency`), each paired with the nominal run episode by episode.

    run_suites(env, policy, cfg, report, execute_steps)   fills report.perturbations and report.latency, writes
                                                          perturbations.png and the worst factor's rollout videos
"""

from __future__ import annotations

import math
from pathlib import Path

from roboloop.evaluation import perturb
from roboloop.evaluation.evaluator import LOOK_EVERY, EvalReport, evaluate, progress_printer


def latencies(spec: str, report: EvalReport) -> list[tuple[str, float]]:
    """`measured` -> the nominal run's own chunk times (p50, p99: through the server for a served policy, else the
    policy's calls in this process); numbers are milliseconds. Returns [(label, ms)]."""
    out: list[tuple[str, float]] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "measured":
            served = report.served or {}
            p50 = served.get("roundtrip_ms_p50", report.plan_ms.get("p50"))
            p99 = served.get("roundtrip_ms_p99", report.plan_ms.get("p99"))
            out += [("measured p50", float(p50 or 0.0)), ("measured p99", float(p99 or 0.0))]
        else:
            out.append((f"{float(part):g} ms", float(part)))
    return out


def cell_stop(cfg, factor: str, level: float, planned: int):
    """The early stop of one perturbation's run against the champion's outcomes under it (`stop_against_perturbed`,
    the gate's robustness margin), and how many paired tests it plans (the gate's final one included); (None,
    None) where the champion has none."""
    ref = ((cfg.stop_against_perturbed or {}).get(factor) or {}).get(f"{level:g}")
    if not ref or cfg.gate_robustness is None:
        return None, None
    from roboloop.binomial import paired_stop

    return paired_stop(ref, planned, LOOK_EVERY, cfg.gate_robustness)


def latency_stop(cfg, label: str, planned: int):
    """The early stop of the run at the measured p99 latency against the champion's at its own (the gate's latency
    check, at its nominal margin), and how many paired tests it plans; (None, None) otherwise."""
    if label != "measured p99" or not cfg.gate_latency or not cfg.stop_against_latency:
        return None, None
    from roboloop.binomial import paired_stop

    return paired_stop(cfg.stop_against_latency, planned, LOOK_EVERY, cfg.stop_margin)


def run_suites(env, policy, cfg, report: EvalReport, execute_steps: int) -> None:
    """Each suite plays the episodes the nominal run played (all of them, or those before its early stop: only
    those pair with it)."""
    out, planned = Path(cfg.output_dir), report.episodes
    if cfg.perturb:
        runs: dict[tuple[str, float], list[dict]] = {}
        videos: dict[tuple[str, float], list[str]] = {}
        extra: dict[tuple[str, float], dict] = {}
        for factor, level in perturb.parse(cfg.perturb, tuple(getattr(env, "scene_factors", ()))):
            tag = f"{factor}={level:g}"
            stop, looks = cell_stop(cfg, factor, level, planned)
            wrapped = perturb.Perturbed(env, factor, level, cfg.seed)
            try:
                rep, _ = evaluate(wrapped, policy, planned, execute_steps, min(cfg.videos, 1),
                                  out / "perturb" / tag if cfg.videos else None, seed=cfg.seed, stop=stop,
                                  progress=progress_printer(f"[progress] perturbed {tag}"),
                                  label=f"{cfg.shown_as()} under {tag}")
            finally:
                wrapped.release()
            runs[(factor, level)], videos[(factor, level)] = rep.per_episode, rep.videos
            extra[(factor, level)] = {"changed_initial": perturb.changed(report.initial_states, rep.initial_states),
                                      **_sequential(looks, rep)}
        report.perturbations = perturb.summarise(report.per_episode, runs, extra)
        worst = perturb.worst(report.perturbations)
        if worst is not None:
            report.perturbation_worst = f"{worst[0]}={worst[1]}"
            report.perturbation_videos = videos.get((worst[0], float(worst[1])), [])
        report.perturbation_plot = str(plot(report, out / "perturbations.png"))
    if cfg.latency:
        report.latency = _latency_rows(env, policy, cfg, report, execute_steps)


def _latency_rows(env, policy, cfg, report: EvalReport, execute_steps: int) -> list[dict]:
    nominal, planned = report.per_episode, report.episodes
    rows = [{"setting": "0 ms", "ms": 0.0, "delay_steps": 0, **perturb.paired(nominal, nominal)}]
    prefetch = getattr(cfg, "prefetch", 0)
    for label, ms in latencies(cfg.latency, report):
        steps = math.floor(ms * env.fps / 1000 + 0.5)  # to the nearest control step
        for ahead in (0, prefetch) if prefetch else (0,):  # as a robot loop without prefetch, then with it
            setting = f"{label}, prefetch {ahead}" if ahead else label
            stop, looks = latency_stop(cfg, setting, planned)  # the gate's check reads the row without prefetch
            rep, _ = evaluate(env, policy, planned, execute_steps, 0, None, seed=cfg.seed, delay_steps=steps,
                              stop=stop, prefetch=ahead,
                              progress=progress_printer(f"[progress] latency {setting} ({steps} steps)"))
            rows.append({"setting": setting, "ms": round(ms, 2), "delay_steps": steps,
                         **({"prefetch": ahead} if ahead else {}),
                         **perturb.paired(nominal, rep.per_episode), **_sequential(looks, rep)})
    return rows


def _sequential(looks: int | None, rep: EvalReport) -> dict:
    """What a suite's row records of a run that could stop early: its planned looks (the gate's test of it spends
    alpha / looks) and why it stopped, if it did."""
    return {**({"looks": looks} if looks and looks > 1 else {}),
            **({"stopped_early": rep.stopped_early} if rep.stopped_early else {})}


def plot(report: EvalReport, png: Path) -> Path:
    """Success per factor and level with its Wilson interval, the nominal rate as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [(f, lv, v) for f, levels in (report.perturbations or {}).items() for lv, v in levels.items()]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(cells) + 2), 3.4))
    xs = list(range(len(cells)))
    rates = [v["success_rate"] for _, _, v in cells]
    err = [[max(0.0, r - v["ci_low"]) for r, (_, _, v) in zip(rates, cells, strict=True)],  # rounding: >= 0
           [max(0.0, v["ci_high"] - r) for r, (_, _, v) in zip(rates, cells, strict=True)]]
    ax.bar(xs, rates, yerr=err, capsize=2, color="tab:orange")
    ax.axhline(report.success_rate, color="tab:blue", label=f"nominal {report.success_rate:.2f}")
    ax.set_xticks(xs, [f"{f}={lv}" for f, lv, _ in cells], rotation=60, ha="right", fontsize=7)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("success rate (95% Wilson)")
    ax.legend(loc="lower left", fontsize=7)
    ax.set_title(f"{report.task} - {report.policy}: perturbed, same {report.episodes} episodes", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
