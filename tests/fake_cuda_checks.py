"""The device-mixing checks, run on the fake ``cuda`` device of :mod:`fake_cuda` in a process of their own.

``python tests/fake_cuda_checks.py OUT.json [NAME ...]`` installs the fake device (before torch is imported: see
:mod:`fake_cuda`), runs each check (all by default) and writes ``{name: null | "what failed"}`` to ``OUT.json``.
``tests/test_device_mixing.py`` runs it once and asserts each check. Not a test module itself (pytest does not
collect it): every check needs the fake device, which the pytest process cannot install once torch is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import fake_cuda  # first: its native hooks must load before torch

fake_cuda.install()

# isort: split
import asyncio  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import harmonyrl  # noqa: E402, F401  # sets MKL's reproducibility mode before torch's first matrix product

# isort: split
import torch  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)  # as tests/conftest.py: the mode every command runs in

from harmonyrl.algorithms import advantages as adv  # noqa: E402
from harmonyrl.types import Routing, Trajectory  # noqa: E402

CUDA = torch.device("cuda", 0)
VOCAB = 97
CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def on_both(fn: Callable[..., Any], *args: torch.Tensor, **kwargs: Any) -> None:
    """``fn`` on the fake device gives the CPU's result bit for bit, and its outputs stay on the fake device."""
    want = fn(*args, **kwargs)
    with fake_cuda.fake_cuda():
        got = fn(*(a.to(CUDA) for a in args), **{k: v.to(CUDA) if isinstance(v, torch.Tensor) else v
                                                  for k, v in kwargs.items()})  # fmt: skip
        outs = got if isinstance(got, tuple) else (got,)
        assert all(o.device == CUDA for o in outs), f"{fn.__name__}: an output left the device"
        host = tuple(o.cpu() for o in outs)
    for w, h in zip(want if isinstance(want, tuple) else (want,), host, strict=True):
        assert torch.equal(w, h), f"{fn.__name__}: differs from the CPU result"


# ---- the pure functions ----------------------------------------------------------------------------------------


@check
def advantages_every_estimator() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 7, 7, 3])
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 0], [0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    values = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    token_rewards = adv.outcome_to_token_rewards(rewards, mask)
    on_both(adv.group_relative_advantages, rewards, groups)
    on_both(adv.dr_grpo_advantages, rewards, groups)
    on_both(adv.rloo_advantages, rewards, groups)
    on_both(adv.reinforce_pp_advantages, rewards, mask, group_ids=groups)
    on_both(adv.reinforce_pp_advantages, rewards, mask, token_rewards=token_rewards)
    on_both(adv.gae_advantages, token_rewards, values, mask, gamma=0.9, lam=0.8, bootstrap=values[:, 0])
    on_both(adv.a2c_advantages, token_rewards, values, mask)
    on_both(lambda *a: adv.value_loss(*a, clip=0.2).loss, values, values * 0.5, token_rewards, mask)
    on_both(lambda *a: adv.value_loss(*a).loss, values, values * 0.5, token_rewards, mask)


# ---- the RL update, every estimator × every loss, R2 and R3 -----------------------------------------------------


def _trajectories(n_layers: int, k: int, with_routing: bool) -> list[Trajectory]:
    """Three groups with mixed rewards and lengths (padding) and one env failure; sampler routing if asked."""
    from harmonyrl.types import Failure

    out = []
    for i, (group, reward, length, prompt) in enumerate(
        [(0, 1.0, 30, 10), (0, 0.0, 22, 10), (0, 0.0, 27, 10), (1, 0.0, 25, 12), (1, 1.0, 19, 12), (2, 1.0, 20, 8)]
    ):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
        routing = None
        if with_routing:  # the sampler's experts (int8), the last position never fed back (-1)
            r = torch.randint(0, 4, (length, n_layers, k), generator=g, dtype=torch.int8)
            r[-1] = -1
            routing = Routing(r)
        out.append(Trajectory(f"t{group}", group, tuple(ids), (0,) * prompt + (1,) * (length - prompt),
                              (-1.0,) * length, reward, True, False, None, (), routing=routing))  # fmt: skip
    out.append(Trajectory("t1", 1, (5, 6, 7), (0, 1, 1), (-1.0,) * 3, 1.0, True, False, Failure("tool_timeout", "x"),
                          (), routing=Routing(torch.full((3, n_layers, k), -1, dtype=torch.int8)) if with_routing
                          else None))  # fmt: skip
    return out


def _update(rl: dict[str, Any]) -> dict[str, float]:
    from harmonyrl.config import RLConfig
    from harmonyrl.models.tiny_gpt_oss import build_config, build_model
    from harmonyrl.rl.learner import Learner

    cfg = RLConfig(**rl)
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    n_layers, k = int(model.config.num_hidden_layers), int(model.config.num_experts_per_tok)
    trajs = _trajectories(n_layers, k, with_routing=rl.get("routing_replay") == "r3")
    with fake_cuda.fake_cuda():
        model = model.to(CUDA)
        learner = Learner.create(cfg, model, pad_id=0, norm=64.0, seed=0)
        metrics = learner.update(trajs).metrics
        assert all(p.device == CUDA for p in model.parameters())
    return metrics


ESTIMATORS: list[dict[str, Any]] = [
    {"kind": "grpo"},
    {"kind": "grpo", "std_normalize": False},
    {"kind": "rloo"},
    {"kind": "reinforce_pp"},
    {"kind": "reinforce_pp", "group_baseline": False},
    {"kind": "gae"},
    {"kind": "a2c"},
]
LOSSES: list[dict[str, Any]] = [{"kind": "ppo_clip", "dual_clip": 3.0}, {"kind": "gspo"}, {"kind": "pg"}]


def _add_update_checks() -> None:
    for a in ESTIMATORS:
        for loss in LOSSES:
            name = "rl_update_" + "_".join(str(v) for v in a.values()) + f"_{loss['kind']}"
            rl = {"advantage": a, "loss": loss, "epochs": 2, "minibatches": 2, "kl": {"coef": 0.01}}
            CHECKS[name] = lambda rl=rl: _assert_trained(_update(rl))


def _assert_trained(metrics: dict[str, float]) -> None:
    assert metrics["guard/skipped"] == 0.0 and metrics["train/episodes"] > 0, metrics


_add_update_checks()


@check
def rl_update_kl_as_reward_entropy_correction() -> None:
    correction = {"weights": {"mode": "truncate"}, "rejection": {"threshold": 5.0}}
    _assert_trained(_update({"kl": {"coef": 0.05, "use": "reward"}, "entropy_coef": 0.01, "epochs": 2,
                             "correction": correction}))  # fmt: skip


@check
def rl_update_soft_q() -> None:
    _update({"loss": {"kind": "soft_q", "replay_batch": 4}})


@check
def rl_update_r2() -> None:
    _assert_trained(_update({"routing_replay": "r2", "epochs": 2, "minibatches": 2}))


@check
def rl_update_r3() -> None:
    _assert_trained(_update({"routing_replay": "r3", "epochs": 2, "minibatches": 2}))


@check
def cuda_rng_state_round_trip() -> None:
    """A checkpoint keeps every GPU's RNG state and a resume puts it back."""
    from harmonyrl.models.tiny_gpt_oss import build_config, build_model
    from harmonyrl.run.checkpoint import load_state, save_checkpoint
    from harmonyrl.run.state import Rngs

    saved = torch.cuda.get_rng_state_all()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
        save_checkpoint(Path(tmp) / "c", model, None, 3, {})
        torch.cuda.set_rng_state(torch.Generator().manual_seed(99).get_state())
        assert not torch.equal(torch.cuda.get_rng_state(), saved[0])
        Rngs.from_plain(load_state(Path(tmp) / "c")).restore()
    assert torch.equal(torch.cuda.get_rng_state_all()[0], saved[0])


# ---- a whole run: SFT, engine, eval, RL, checkpoints, resume ---------------------------------------------------


def _run(folder: Path, overrides: list[str], resume: bool = False) -> Any:
    from rich.console import Console

    from harmonyrl.config import load_config
    from harmonyrl.jobs.train import train
    from tiny_run import tiny_run

    config = load_config(None, tiny_run(*overrides, "device=cuda", f"output_dir={folder}", "run_name=run"))
    with fake_cuda.fake_cuda():
        return asyncio.run(train(config, Console(quiet=True), resume=resume))


@check
def train_sft_eval_rl_checkpoint_resume() -> None:
    """``harmonyrl train device=cuda``: SFT, the embedded engine (torch decode) and eval, an R3 RL update with the
    engine's routing, the checkpoints; then a run stopped after RL step 1 and resumed from its last checkpoint
    (model, optimizer and RNG states back on the device) to train step 2."""
    from harmonyrl.run.checkpoint import load_state

    small = ["sft.steps=2", "rl.steps=2", "eval.n_tasks=2", "rollout.max_new_tokens=12", "rl.routing_replay=r3",
             "rl.skip_zero_variance_groups=false", "threads=1"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        whole = _run(Path(tmp) / "a", small)
        state = load_state(Path(tmp) / "a" / "run" / "checkpoints" / "final")
        assert "rng_cuda" in state, "the checkpoint keeps no CUDA RNG state"
        rl_rows = _rl_rows(Path(tmp) / "a")
        assert [r["train/skipped"] for r in rl_rows] == [0.0, 0.0], "an RL step did not train"
        assert all(r["routing/agreement"] == 1.0 for r in rl_rows), "R3 did not replay the engine's routing"
        # cut after RL step 1: the same run, stopped there, then resumed to step 2
        _run(Path(tmp) / "b", [*small[:1], "rl.steps=1", *small[2:]])
        config = Path(tmp) / "b" / "run" / "config.yaml"
        config.write_text(config.read_text().replace("steps: 1\n", "steps: 2\n", 1))
        resumed = _run(Path(tmp) / "b", small, resume=True)
        cut = _rl_rows(Path(tmp) / "b")
    assert [r["step"] for r in cut] == [1, 2] and cut[1]["train/skipped"] == 0.0, "the resumed run did not train"
    assert resumed.run_dir == Path(tmp) / "b" / "run" and whole.run_dir != resumed.run_dir


def _rl_rows(folder: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "rl"]


def main(out: Path, names: list[str]) -> None:
    results: dict[str, str | None] = {}
    for name in names or list(CHECKS):
        try:
            CHECKS[name]()
            results[name] = None
        except Exception as e:
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "harmonyrl" in f.filename]
            where = f" (last harmonyrl frame {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            results[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{where}"
            print(f"--- {name}\n{traceback.format_exc()}", file=sys.stderr)
        print(f"{name}: {results[name] or 'ok'}", flush=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
