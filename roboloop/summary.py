"""What one pass of the closed loop produced, as `make demo` prints it and the report artifact shows it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from roboloop.receipts import Decision


class LoopSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    dataset_v3: str
    dataset_md5: str
    model: str
    model_md5: str
    weights_sha256: str
    final_loss: float | None
    success_rate: float
    ci: tuple[float, float]
    eval_run: str
    random_success_rate: float | None
    decision: Decision

    def markdown(self) -> str:
        d = self.decision
        loss = "n/a" if self.final_loss is None else f"{self.final_loss:.4f}"
        lines = ["## roboloop closed loop", "", "| stage | result |", "|---|---|",
                 f"| dataset | `{self.dataset_v3}` (md5 `{self.dataset_md5}`) |",
                 f"| model | `{self.model}` (final loss {loss}) |",
                 f"| policy success | **{self.success_rate:.1%}** (95% CI {self.ci[0]:.1%}-{self.ci[1]:.1%}) |"]
        if self.random_success_rate is not None:
            lines.append(f"| random policy | {self.random_success_rate:.1%} |")
        lines.append(f"| registry | `{d.name}` v{d.version} in `{d.registry}`; promoted: {d.promoted} |")
        return "\n".join(lines)
