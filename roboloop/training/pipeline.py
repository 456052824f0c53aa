"""From the key stream to device-resident packed batches, one step ahead of the model.

`Packer` forms global packs of frame keys (cheap: no decoding). `BatchPipeline` turns a
pack into this rank's `PackedBatch` and keeps the *next* one in flight while the current
step runs: its windows decode on the stream's thread pool, and on CUDA the collated batch
is pinned and copied to the device on a side stream (non-blocking), with an event the
compute stream waits on before using it. That is the double buffer: batch s computes while
batch s+1 is decoded and transferred. `state_dict()` is the position *before* the batch in
flight, so a checkpoint resumes with exactly the batches an uninterrupted run would train.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from roboloop.training.data import SampleStream
from roboloop.training.packing import PackedBatch, collate


class Packer:
    """Forms global packs of keys from the stream; its state includes the one key carried over.

    A global pack holds up to `max_tokens * world_size` backbone tokens (and at least one
    sample per rank); rank r trains on its samples r, r+W, ... (see `distributed`).
    """

    def __init__(self, stream: SampleStream, max_tokens: int, max_samples: int, tokens_per_image: int,
                 world_size: int = 1):
        self.stream, self.tpi, self.world = stream, tokens_per_image, world_size
        self.budget, self.max_samples = max_tokens * world_size, max_samples * world_size
        self.max_tokens = max_tokens
        self.carry: int | None = None
        self.carry_state: dict | None = None

    def next(self) -> list[int]:
        keys: list[int] = [self.carry] if self.carry is not None else []
        used = sum(self.stream.num_tokens(k, self.tpi) for k in keys)
        self.carry = self.carry_state = None
        while True:
            state = self.stream.state_dict()
            k = self.stream.next_key()
            n = self.stream.num_tokens(k, self.tpi)
            if n > self.max_tokens:
                raise ValueError(f"a sample needs {n} tokens, more than max_tokens={self.max_tokens}")
            full = used + n > self.budget or len(keys) >= self.max_samples
            if len(keys) >= self.world and full:
                self.carry, self.carry_state = k, state
                return keys
            keys.append(k)
            used += n

    def state_dict(self) -> dict:
        return self.carry_state if self.carry is not None else self.stream.state_dict()  # type: ignore[return-value]


Plan = tuple[list[int], list[int], float, dict, int]  # keys, mine, denominator, position, micro-batch index


@dataclass
class Ready:
    """One micro-batch's input: the global pack (one optimizer step's), this rank's share of it for this micro-batch
    on the device, and where the pack came from."""

    keys: list[int]  # the global pack
    mine: list[int]  # this rank's keys (of this micro-batch)
    denominator: float  # valid action steps in the global pack (loss normalisation)
    batch: PackedBatch
    position: dict  # stream position before this pack
    event: torch.cuda.Event | None = None
    micro: int = 0  # which micro-batch of the pack (accumulation)


class BatchPipeline:
    def __init__(self, packer: Packer, stream: SampleStream, rank: int, world_size: int, tokens_per_image: int,
                 device: torch.device, prefetch: bool = True, lookahead: bool | None = None, accumulate: int = 1):
        """`accumulate` N: a pack is one optimizer step's for N x world_size slots (the packer's world); rank r's
        micro-batch j trains on slot j * world_size + r, so N micro-batches on one rank see what N ranks would."""
        self.packer, self.stream, self.rank, self.world = packer, stream, rank, world_size
        self.accumulate = accumulate
        self._pending: list[Plan] = []  # the current pack's later micro-batches
        self.tpi, self.device, self.prefetch = tokens_per_image, device, prefetch
        self.cuda = device.type == "cuda"
        # lookahead: the batch after the next one is planned (its decoding started on the stream's threads) when
        # the next one is built, so decoding has a whole step to finish. On by default on CUDA, where the training
        # loop's thread would otherwise wait for it while the GPU runs out of work (suspected, not yet measured:
        # on an H200 ACT at 480x640 ran at 0.75x lerobot-train's samples/s with no wait in `next()`, which does
        # not see this; `data_build_fraction` in metrics.jsonl now does); on CPU the decode threads would compete
        # with the step for the cores
        self.lookahead = prefetch and (self.cuda if lookahead is None else lookahead)
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self._next: Ready | None = None
        self._planned: Plan | None = None  # after `_next`, decoding
        self.wait_s = 0.0  # time the last `next()` blocked the training loop
        self.build_s = 0.0  # time the last `prepare_next()` spent building (decode waits, collate, copy launch)

    def _plan(self) -> Plan:
        if self._pending:
            return self._pending.pop(0)
        position = self.packer.state_dict()
        keys = self.packer.next()
        slots = self.world * self.accumulate
        shares = [keys[j * self.world + self.rank :: slots] for j in range(self.accumulate)]
        for mine in shares:
            self.stream.prefetch(mine)  # decode starts now, on the stream's threads
        denom = float(sum(self.stream.num_valid_steps(k) for k in keys))
        self._pending = [(keys, mine, denom, position, j) for j, mine in enumerate(shares) if j]
        return keys, shares[0], denom, position, 0

    def _take_plan(self) -> Plan:
        plan, self._planned = self._planned, None
        return plan if plan is not None else self._plan()

    def _build(self, plan: Plan) -> Ready:
        keys, mine, denom, position, micro = plan
        batch = collate(self.stream.materialize(mine), self.tpi, self.stream.state_tokens)
        if not self.cuda:
            return Ready(keys, mine, denom, batch, position, micro=micro)
        assert self.copy_stream is not None
        batch = batch.pin_memory()
        with torch.cuda.stream(self.copy_stream):
            on_dev = batch.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        return Ready(keys, mine, denom, on_dev, position, event, micro)

    def next(self) -> Ready:
        t0 = time.perf_counter()
        cur = self._next if self._next is not None else self._build(self._take_plan())
        self._next = None
        if cur.event is not None:
            torch.cuda.current_stream(self.device).wait_event(cur.event)
            for t in vars(cur.batch).values():  # the copy stream's memory is now used by the compute stream
                t.record_stream(torch.cuda.current_stream(self.device))
        self.wait_s = time.perf_counter() - t0
        return cur

    def prepare_next(self) -> None:
        """Start the following batch (call after launching the current step's work)."""
        t0 = time.perf_counter()
        if self.prefetch and self._next is None:
            self._next = self._build(self._take_plan())
            if self.lookahead:
                self._planned = self._plan()
        self.build_s = time.perf_counter() - t0

    def state_dict(self) -> dict:
        """Stream position of the first pack not yet trained on (asked between optimizer steps: every micro-batch of
        the packs before it trained on; within a pack it would replay the pack, so it is refused)."""
        first = self._next.micro if self._next is not None else self._pending[0][4] if self._pending else 0
        if first:
            raise RuntimeError("the data position within an accumulation window: checkpoints are taken between "
                               "optimizer steps")
        if self._next is not None:
            return self._next.position
        return self._planned[3] if self._planned is not None else self.packer.state_dict()
