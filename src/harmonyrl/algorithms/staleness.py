"""How far one update moves when its samples are stale: the staleness-aware learning rate of the asynchronous
pipeline (``rl.async.lr_decay``, docs/async.md).

With rollouts k versions ahead of the trainer the update at version s follows a gradient taken on version s − k's
samples: a delayed-feedback loop. Delayed gradient descent stays stable only with a step size that shrinks with
the delay (on a quadratic of curvature λ, delay τ: lr·λ < 2 sin(π / (2(2τ + 1))), 2 at τ = 0, 1 at τ = 1, 0.62 at
τ = 2); asynchronous SGD therefore divides the learning rate by the staleness (Zhang, Gupta, Lian, Liu 2016,
"Staleness-aware async-SGD for distributed deep learning", IJCAI). Scaling the *loss* instead would do nothing
under Adam, whose step is invariant to the gradient's scale: the learning rate is what must shrink.
"""

from __future__ import annotations


def staleness_lr_scale(staleness: float, decay: float) -> float:
    """The factor on the learning rate of an update whose samples lag the trainer by ``staleness`` versions:
    ``1 / (1 + decay · staleness)``. ``decay = 0`` (or staleness 0) gives exactly 1.0; ``decay = 1`` is the
    staleness-aware async-SGD rule ``lr / (1 + τ)``.

    Example (hand-derived): staleness 2, decay 0.5: 1 / (1 + 1) = 0.5; staleness 1, decay 0.25: 1 / 1.25 = 0.8.
    """
    if staleness < 0 or decay < 0:
        raise ValueError(f"staleness ({staleness}) and decay ({decay}) must be >= 0")
    return 1.0 / (1.0 + decay * staleness)
