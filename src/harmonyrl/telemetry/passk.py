"""pass@k: the chance that at least one of k samples solves a task, estimated from n ≥ k samples.

Why not the naive ``1 - (1 - c/n)**k``: that plugs the empirical rate into the formula for independent draws
*with* replacement and is biased (it overestimates pass@k for small n). The unbiased estimator draws the k
samples *without* replacement from the n we have (Chen et al., 2021, "Evaluating Large Language Models Trained
on Code"):

    pass@k = 1 - C(n - c, k) / C(n, k)

The binomials overflow floats for realistic n and lose precision as big-integer ratios are rounded, so the
ratio is computed as the product ``prod_{i = n-c+1}^{n} (1 - k / i)``, whose factors all lie in [0, 1).

RL can raise pass@1 while pass@k falls (the policy narrows onto one way of solving), so report several k.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _check_int(name: str, value: int) -> None:
    # bool is an int subclass; pass_at_k(True, ...) is almost certainly a bug at the call site.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"pass@k: {name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"pass@k: {name} must be >= 0, got {value}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples of which ``c`` were correct.

    Raises ``ValueError`` for non-integers, negatives, ``k == 0`` (pass@0 has no meaning), ``c > n`` and
    ``k > n`` (k samples cannot be drawn without replacement from fewer than k).
    """
    _check_int("n", n)
    _check_int("c", c)
    _check_int("k", k)
    if k == 0:
        raise ValueError("pass@k: k must be >= 1")
    if c > n:
        raise ValueError(f"pass@k: c={c} correct samples cannot exceed n={n} samples")
    if k > n:
        raise ValueError(f"pass@k: k={k} needs at least k samples per task, got n={n}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    miss_all = 1.0
    for i in range(n - c + 1, n + 1):
        miss_all *= 1.0 - k / i
    return 1.0 - miss_all


def mean_pass_at_k(correct_per_task: Sequence[Sequence[bool]], ks: Iterable[int]) -> dict[str, float]:
    """Mean pass@k over tasks, as ``{"pass@1": …, "pass@2": …}`` in increasing k.

    ``correct_per_task[t][j]`` says whether sample ``j`` of task ``t`` was correct; tasks may have different
    sample counts. A k larger than the smallest count is left out rather than raised: an evaluation asks for
    "pass@1, 4, 8" up front, and a task with fewer samples makes the larger k unmeasurable, not wrong.
    """
    ks = sorted(set(ks))
    for k in ks:
        _check_int("k", k)
        if k == 0:
            raise ValueError("pass@k: k must be >= 1")
    if not correct_per_task:
        raise ValueError("pass@k: no tasks given")
    counts = [(len(samples), sum(bool(x) for x in samples)) for samples in correct_per_task]
    min_n = min(n for n, _ in counts)
    if min_n == 0:
        raise ValueError("pass@k: a task has no samples")
    return {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks if k <= min_n}
