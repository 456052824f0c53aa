"""Prefect events the stages emit, which automations in deployments/prefect.yaml react to.

    roboloop.model.registered   a new registry version (not re-registered weights)
    roboloop.model.promoted     the promotion gate made a version champion
    roboloop.model.rejected     the gate kept the champion (the version became challenger)
    roboloop.dataset.version-added  a dataset version a stage produced (converted, aggregated)
    roboloop.dataset.arrived    a new or changed dataset in a watched location (flows/watch.py)

Resources: `roboloop.model.<name>` (with `roboloop.registry`, `roboloop.version`) and
`roboloop.dataset.<md5>` (with `roboloop.path`, `roboloop.source`); payloads carry the receipt.
"""

from __future__ import annotations

from prefect.events import emit_event

from roboloop.receipts import DatasetRef, Decision


def model_events(d: Decision, weights_sha256: str) -> list[str]:
    resource = {"prefect.resource.id": f"roboloop.model.{d.name}", "prefect.resource.name": d.name,
                "roboloop.registry": d.registry, "roboloop.version": str(d.version)}
    payload = {"name": d.name, "version": d.version, "registry": d.registry, "weights_sha256": weights_sha256,
               "ref": f"registry:{d.registry}#{d.name}@{d.version}"}
    names = [] if d.reused else ["roboloop.model.registered"]
    if d.promoted is not None and d.reason != "already champion":
        names.append("roboloop.model.promoted" if d.promoted else "roboloop.model.rejected")
    for name in names:
        emit_event(name, resource=resource, payload={**payload, "reason": d.reason, "champion": d.champion})
    return names


def dataset_added(ref: DatasetRef, stage: str) -> None:
    emit_event("roboloop.dataset.version-added",
               resource={"prefect.resource.id": f"roboloop.dataset.{ref.md5}", "prefect.resource.name": ref.path,
                         "roboloop.path": ref.path, "roboloop.source": ref.source or ""},
               payload={"stage": stage, **ref.model_dump(mode="json")})


def dataset_arrived(path: str, location: str) -> None:
    from roboloop.stages import slug

    emit_event("roboloop.dataset.arrived", resource={"prefect.resource.id": f"roboloop.location.{slug(path, 96)}",
                                                     "prefect.resource.name": path, "roboloop.path": path},
               payload={"location": location, "path": path})
