"""The engine side of the server: one thread owns the target and drafter and runs one generation at a time,
taking requests in arrival order (FIFO).

`hyflash serve` runs the engine on the process's main thread (`EngineWorker.run`) and uvicorn in a second
thread: the same `generate` call decoded 20-25% slower in a worker thread than in the main thread on a 2-core
CPU (experiments/serve_bench/where_time_goes.py). Tests may still run it in its own thread (`start`).

The decode loop is `decoding.generate`, unchanged. Its `on_tokens` callback, called once per target pass with
the tokens that pass committed, is where the server hooks in: it turns tokens into text deltas, watches for
stop strings, and ends a generation early (a stop string found, a client gone, the server stopping) by
raising a private exception that this module catches.

Jobs talk to the asyncio side through an asyncio.Queue of events (Started, Delta, Done, Failed) fed with
`call_soon_threadsafe`, so the event loop never blocks on the engine.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from hyflash.decoding import generate
from hyflash.sampling import SamplingConfig

log = logging.getLogger("hyflash.serve")

REPLACEMENT_CHAR = "\ufffd"  # what a tokenizer decodes the first bytes of an unfinished UTF-8 character to


class _EndGeneration(Exception):
    """Raised from on_tokens to leave `generate` at the end of a pass; `reason` is the finish reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    seed: int
    stop: tuple[str, ...] = ()


@dataclass
class Summary:
    """What a finished generation reports: usage, finish reason and the hyflash extension object."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # stop | length
    tau: float
    decode_tokens_per_second: float
    time_to_first_token: float  # seconds from the engine taking the job to the first committed token
    queue_seconds: float
    policy: dict = field(default_factory=dict)
    cached_prompt_tokens: int = 0  # prompt tokens taken from the cache of the request before

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_prompt_tokens}}

    def extension(self) -> dict:
        return {"tau": round(self.tau, 4), "decode_tokens_per_second": round(self.decode_tokens_per_second, 2),
                "time_to_first_token_s": round(self.time_to_first_token, 4),
                "queue_s": round(self.queue_seconds, 4),
                "drafts_verified_by_source": self.policy.get("draft_sources", {}), "policy": self.policy}


@dataclass(frozen=True)
class Started:
    pass


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Done:
    summary: Summary


@dataclass(frozen=True)
class Failed:
    status: int
    message: str


class TextStream:
    """Committed tokens in, text deltas out, so that the deltas join into exactly `decode(all tokens)`.

    The whole sequence is decoded each time (a merged or multi-byte token changes how its neighbours decode;
    the cost is small next to a target pass). A trailing replacement character (a character whose bytes have
    not all arrived) and the last len(longest stop) - 1 characters (the start of a stop string, maybe) are
    held back until the next tokens decide them. Generation stops at the first occurrence of any stop string,
    which is cut from the text.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()):
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False

    def feed(self, ids: list[int]) -> str:
        self._ids.extend(ids)
        self.text = self._decode(self._ids)
        cut = min((i for i in (self.text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._take(cut)
        safe = len(self.text.rstrip(REPLACEMENT_CHAR)) - self._hold
        return self._take(safe)

    def finish(self) -> str:
        """The text still held back, once no more tokens will come."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self.sent:
            return ""
        delta, self.sent = self.text[self.sent : end], end
        return delta


class Job:
    """One request's generation. The handler waits on `events`; the worker claims it when its turn comes.

    A queued job can be abandoned (queue timeout); a running one can be cancelled (client gone): the worker
    sees the flag at its next pass.
    """

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.events: asyncio.Queue = asyncio.Queue()
        self.enqueued = time.perf_counter()
        self._loop = loop
        self._lock = threading.Lock()
        self._state = "queued"  # -> running (worker) or abandoned (handler)
        self._cancelled = threading.Event()

    def claim(self) -> bool:
        """The engine takes the job; False when it was abandoned first."""
        return self._leave_queue("running")

    def abandon(self) -> bool:
        """Withdraw a job still waiting in the queue; False when the engine has already started it."""
        return self._leave_queue("abandoned")

    def _leave_queue(self, state: str) -> bool:
        with self._lock:  # the engine thread and the event loop race for a queued job: exactly one wins
            if self._state != "queued":
                return False
            self._state = state
            return True

    def cancel(self) -> None:
        self.abandon()
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def emit(self, event) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


class EngineWorker:
    """Owns target, drafter and policy and serves jobs one at a time, first come first served: in its own
    thread (`in_thread=True`: `start` starts it) or in whichever thread calls `run` (it returns after `stop`)."""

    def __init__(self, target, drafter=None, policy=None, on_finish: Callable[[str, Summary | None], None] | None = None,
                 in_thread: bool = True):
        self.target, self.drafter, self.policy = target, drafter, policy
        self._on_finish = on_finish or (lambda reason, summary: None)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0
        self._count_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, name="hyflash-engine", daemon=True) if in_thread else None
        self.busy = False

    # ----- the asyncio side ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; nothing to do when the caller runs the engine itself (`in_thread=False`)."""
        if self._thread is not None:
            self._thread.start()

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Job:
        job = Job(request, loop)
        if self._stopping.is_set():
            job.emit(Failed(503, "the server is shutting down"))
            return job
        with self._count_lock:
            self._waiting += 1
        self._jobs.put(job)
        return job

    def withdraw(self, job: Job) -> bool:
        """Abandon a queued job (the queue timeout); False when it is already running."""
        if not job.abandon():
            return False
        self._left_queue()
        return True

    @property
    def waiting(self) -> int:
        """Jobs queued and not yet started."""
        return self._waiting

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the running generation at its next pass, fail the queued ones, end the thread."""
        self._stopping.set()
        self._jobs.put(None)
        if self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ----- the engine thread ----------------------------------------------------------------------------
    def _left_queue(self) -> None:
        with self._count_lock:
            self._waiting -= 1

    def run(self) -> None:
        """Serve jobs in the calling thread until `stop`."""
        while True:
            job = self._jobs.get()
            if job is None:
                break
            if not job.claim():
                continue  # abandoned while queued: already counted out
            self._left_queue()
            if self._stopping.is_set():
                job.emit(Failed(503, "the server is shutting down"))
                continue
            self.busy = True
            try:
                self._serve(job)
            finally:
                self.busy = False
        while True:  # jobs that arrived after the stop signal
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.claim():
                self._left_queue()
                job.emit(Failed(503, "the server is shutting down"))

    def _serve(self, job: Job) -> None:
        request, started = job.request, time.perf_counter()
        job.emit(Started())
        text = TextStream(self.target.decode, request.stop)
        progress = _Progress(started)

        def on_tokens(new: list[int]) -> None:
            if job.cancelled or self._stopping.is_set():
                raise _EndGeneration("cancelled")
            progress.add(new)
            delta = text.feed(new)
            if delta:
                job.emit(Delta(delta))
            if text.stopped:
                raise _EndGeneration("stop")

        # Each request starts from the policy as loaded, as each `hyflash generate` does: what one request taught
        # it must not change another's drafts (a seeded sample would then depend on the requests before it).
        policy = copy.deepcopy(self.policy)
        try:
            result = generate(self.target, request.prompt_ids, self.drafter, max_new_tokens=request.max_tokens,
                              sampling=request.sampling, seed=request.seed, on_tokens=on_tokens, policy=policy)
            ended_at_eos = bool(result.tokens) and result.tokens[-1] in self.target.eos_token_ids
            reason = "stop" if ended_at_eos else "length"
        except _EndGeneration as end:
            reason = end.reason
        except Exception as exc:  # the engine failed: this request gets a 500, the server serves on
            log.exception("generation failed")
            self._on_finish("error", None)
            job.emit(Failed(500, f"generation failed: {one_line(exc)}"))
            return
        if reason == "cancelled":
            self._on_finish(reason, None)
            stopping = self._stopping.is_set()  # else the client has gone and nobody reads this
            job.emit(Failed(503, "the server is shutting down") if stopping else Failed(499, "cancelled"))
            return
        tail = text.finish()
        if tail:
            job.emit(Delta(tail))
        summary = Summary(
            text=text.text, prompt_tokens=len(request.prompt_ids), completion_tokens=progress.tokens,
            finish_reason=reason, tau=progress.tau, decode_tokens_per_second=progress.decode_rate,
            time_to_first_token=progress.first - started, queue_seconds=started - job.enqueued,
            policy=policy.stats() if self.drafter is not None and policy is not None else {},
            cached_prompt_tokens=self.target.reused_tokens,
        )
        self._on_finish(reason, summary)
        job.emit(Done(summary))


def one_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class _Progress:
    """τ and decode speed as `GenerationResult` defines them, counted from the on_tokens calls (so they exist
    also for a generation a stop string ended): the first call is the prefill's token, each later one a pass."""

    def __init__(self, started: float):
        self.first = self.last = started
        self.tokens = self.passes = self.after_prefill = 0

    def add(self, new: list[int]) -> None:
        now = time.perf_counter()
        if self.tokens == 0:
            self.first = now
        else:
            self.passes += 1
            self.after_prefill += len(new)
        self.tokens += len(new)
        self.last = now

    @property
    def tau(self) -> float:
        return self.after_prefill / max(1, self.passes)

    @property
    def decode_rate(self) -> float:
        elapsed = self.last - self.first
        return self.tokens / elapsed if elapsed > 0 else 0.0
