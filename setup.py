"""Build of the optional C decode step (everything else is declared in pyproject.toml).

``optional=True``: a machine without a C compiler still installs harmonyrl, and the engine runs its eager
torch decode path instead (``rollout.engine.kernel=auto``). OpenMP links to ``libgomp.so.1``, the soname of
the libgomp that torch's wheel loads first, so the step shares torch's thread team instead of adding one.
"""

from setuptools import Extension, setup

NATIVE = "src/harmonyrl/engine/local/csrc"

setup(
    ext_modules=[
        Extension(
            "harmonyrl.engine.local._decode",
            sources=[f"{NATIVE}/{name}.c" for name in ("decode", "decode_avx2", "decode_generic", "sample")],
            depends=[f"{NATIVE}/kernels.h", f"{NATIVE}/model.h"],
            # -Wno-psabi: the generic build passes 32-byte vectors between inlined helpers, which GCC warns about
            extra_compile_args=["-O3", "-fopenmp", "-std=gnu11", "-fno-math-errno", "-Wno-psabi"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    ]
)
