"""What a run is built from: process set-up, run folder and metrics writers, environment factory, model,
engine and held-out evaluation. :mod:`harmonyrl.jobs.train` puts them together top to bottom."""

from __future__ import annotations

import functools
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import GptOssForCausalLM
from transformers.utils import logging as hf_logging

from harmonyrl.config import FaultInjectionConfig, RunConfig, dump_config
from harmonyrl.engine.base import Engine
from harmonyrl.engine.config import LocalEngineConfig, VllmEngineConfig
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.local.native import isa, native_unsupported, use_native
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.engine.vllm_check import check_server
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.faults import inject_faults
from harmonyrl.errors import CheckpointError, NoHeldOutTasks
from harmonyrl.harmony.codecs import RunCodec, load_codec, vocab_mismatch
from harmonyrl.learn.device import base_dtype, free_bytes, resolve_device
from harmonyrl.learn.footprint import check_fits
from harmonyrl.models import grad_checkpointing
from harmonyrl.models.attention import THREAD_INVARIANT_KERNELS, set_kernel
from harmonyrl.models.lora import (
    ADAPTER_FILE,
    adapted_names,
    add_lora,
    cast_base,
    has_lora,
    load_adapters,
    merged_model,
)
from harmonyrl.models.real import check_checkpoint, first_problem
from harmonyrl.models.real import load_config as load_checkpoint_config
from harmonyrl.models.sinks import set_sinks
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, check_max_seq_len, load_model
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.run.evaluate import evaluate
from harmonyrl.run.folder import clear_for_overwrite
from harmonyrl.run.opponent import CheckpointPlayer
from harmonyrl.run.resume import Progress, load_progress, plan_rewind, rewind_files
from harmonyrl.tasks.ecosystems.textarena_config import TextArenaEnvConfig
from harmonyrl.tasks.factory import make_factory as make_env_factory
from harmonyrl.telemetry.metrics import JsonlWriter
from harmonyrl.telemetry.writers import (
    MetricsWriter,
    MultiWriter,
    TensorBoardWriter,
    WandbWriter,
    WriterUnavailableError,
)
from harmonyrl.threads import configure as configure_threads
from harmonyrl.types import Task


def setup_process(seed: int, threads: int, adaptive_threads: bool = False) -> None:
    """Process-wide set-up every command shares: seeds, threads, deterministic kernels, and quiet
    transformers logging (our progress display is the one to watch, not its per-file load/save bars)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    random.seed(seed)
    torch.manual_seed(seed)
    configure_threads(threads, adaptive_threads)  # fixed, or adapted to the free cores (harmonyrl/threads.py)
    torch.use_deterministic_algorithms(True, warn_only=True)


def adapts_threads(config: RunConfig) -> bool:
    """Whether the thread team follows the load: ``adaptive_threads`` with an attention kernel whose bits do not
    depend on the team, so that adapting never changes a run's numbers (``eager`` keeps a fixed team)."""
    return config.adaptive_threads and config.model.attention in THREAD_INVARIANT_KERNELS


def check_sinks(config: RunConfig) -> None:
    """Fail before the run folder exists when an optional metrics writer's package is missing."""
    import importlib.util

    for wanted, package in ((config.telemetry.tensorboard, "tensorboard"), (config.telemetry.wandb, "wandb")):
        if wanted and importlib.util.find_spec(package) is None:
            raise WriterUnavailableError(
                f"telemetry.{package}=true needs the optional '{package}' package: "
                f"pip install 'harmonyrl[{package}]' (or set telemetry.{package}=false)"
            )


def open_writers(config: RunConfig, run_dir: Path) -> MultiWriter:
    """JSONL always (``metrics.jsonl``); TensorBoard and W&B (offline) when configured."""
    writers: list[MetricsWriter] = [JsonlWriter(run_dir / "metrics.jsonl")]
    if config.telemetry.tensorboard:
        writers.append(TensorBoardWriter(run_dir / "tensorboard"))
    if config.telemetry.wandb:
        writers.append(WandbWriter(run_dir, run_dir.name, config=config.model_dump(mode="json")))
    return MultiWriter(writers)


def prepare_run_dir(config: RunConfig, overwrite: bool = False) -> Path:
    """A fresh run folder; refuses to reuse a non-empty one (unless ``overwrite``: an earlier run folder of that
    name is deleted first) so no earlier run is lost by mistake."""
    name = config.run_name or time.strftime("%Y%m%d-%H%M%S")
    run_dir = config.output_dir / name
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"run folder '{run_dir}' already exists and is not empty; choose another run_name, "
                "continue it with --resume or replace it with --overwrite"
            )
        clear_for_overwrite(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    return run_dir


def make_factory(config: RunConfig) -> EnvFactory:
    """The run's environments: built here, or (``scale.ray``) in Ray env workers that build their own from the
    same config; this process's factory then only lists the tasks. Close it with ``close_env_pool``."""
    if not config.scale.ray:
        return env_factory(config)
    from harmonyrl.distributed.ray_cluster import start_env_pool  # Ray is imported only when asked for

    lister = make_env_factory(config.env, config.seed)  # lists the tasks only: no opponent to load here
    return start_env_pool(config.scale, functools.partial(env_factory, config), lister)


def env_factory(config: RunConfig) -> EnvFactory:
    """The env config's factory, with what only the run can build: a checkpoint opponent's player."""
    env = config.env
    if not isinstance(env, TextArenaEnvConfig) or (folder := env.opponent_checkpoint) is None:
        return make_env_factory(env, config.seed)
    return make_env_factory(env, config.seed, opponent_player(config, folder, env.opponent_temperature))


def opponent_player(config: RunConfig, folder: Path, temperature: float) -> CheckpointPlayer:
    """``env.opponent=<folder>``: the checkpoint loaded (fitting the run's tokenizer and episode length, else one
    line), on its own embedded engine with the run's engine settings where it has them, and the player on it."""
    tok = load_codec(config.model.tokenizer)
    r = config.rollout
    local = r.engine if isinstance(r.engine, LocalEngineConfig) else LocalEngineConfig()  # never the policy's server
    device, dtype = resolve_device(config.device), _local_dtype(local)
    engine = LocalEngine(
        load_for(folder, tok, r.max_seq_len, dtype, device),
        max_batch=local.max_batch,
        max_seq_len=r.max_seq_len,
        dtype=dtype,
        kernel=local.kernel if device.type == "cpu" else "torch",
        device=device,
    )
    limits = EpisodeLimits(r.max_turns, r.max_new_tokens, r.max_seq_len, r.episode_timeout_s)
    return CheckpointPlayer(engine, tok, temperature, limits)


def with_faults(factory: EnvFactory, faults: FaultInjectionConfig, step: int) -> EnvFactory:
    """``factory`` with injected tool faults for one RL step's rollout (``env_faults``), else ``factory``.

    A fresh injector per step: its counts are that step's, and its draws depend on the step, not on what ran
    before it, so a resumed run injects the same faults as an uninterrupted one."""
    if faults.rate == 0.0:
        return factory
    return inject_faults(factory, faults.rate, faults.kinds, faults.seed * 1_000_003 + step, faults.timeout_delay_s)


def load_for(
    path: Path,
    tok: RunCodec,
    max_seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> GptOssForCausalLM:
    """A checkpoint that must fit the run's tokenizer (else every id would mean something else; the error names
    the ``model.tokenizer`` that fits) and, given ``max_seq_len``, hold positions for episodes that long; loaded in
    ``dtype`` onto ``device`` (default: fp32 on the CPU), once its weights are known to fit there."""
    target = device or torch.device("cpu")
    try:
        shape = load_checkpoint_config(path)
    except CheckpointError:
        shape = None  # another layout (OpenAI's original/), or a broken folder: load_model says which
    if shape is not None:
        check_fits(shape, dtype.itemsize, free_bytes(target), f"checkpoint '{path}' on {target}")
    model = load_model(path, dtype=dtype, device=device)
    if (mismatch := vocab_mismatch(f"checkpoint '{path}'", int(model.config.vocab_size), tok)) is not None:
        raise CheckpointError(mismatch)
    if max_seq_len is not None:
        check_max_seq_len(model.config, max_seq_len, f"checkpoint '{path}'")
    return model


def for_training(config: RunConfig, model: GptOssForCausalLM) -> GptOssForCausalLM:
    """``model`` as the trainer runs it: the configured attention kernel, LoRA adapters (``model.lora``),
    activation checkpointing, on the configured device."""
    m = config.model
    set_kernel(model, m.attention)
    if m.lora is not None:
        add_lora(model, m.lora.r, m.lora.alpha, m.lora.dropout, m.lora.targets, seed=config.seed)
        cast_base(model, base_dtype(m.precision, lora=True))  # bf16 with bf16 precision; the adapters stay fp32
    if m.gradient_checkpointing:
        grad_checkpointing.enable(model)
    # transformers wraps PreTrainedModel.to with functools.wraps(Module.to), which types it as unbound
    torch.nn.Module.to(model, resolve_device(config.device))  # in place
    return model


def make_model(config: RunConfig, tok: RunCodec) -> GptOssForCausalLM:
    """The trainer's model (fresh or from ``model.init_from``), ready to train (:func:`for_training`). With
    LoRA this is also the frozen base of every checkpoint's adapters."""
    if (init := config.model.init_from) is not None:  # straight in the base's dtype onto the device
        dtype, device = base_dtype(config.model.precision, config.model.lora is not None), resolve_device(config.device)
        return for_training(config, load_for(init, tok, config.rollout.max_seq_len, dtype, device))
    mcfg = build_config(
        config.model.preset,
        tok.vocab_size,
        tok.special.endoftext,
        tok.special.return_,
        max_positions=max(1024, config.rollout.max_seq_len),
    )
    model = build_model(mcfg, seed=config.seed, head_init=config.model.head_init)
    if config.model.sink_init is not None:
        set_sinks(model, config.model.sink_init)
    return for_training(config, model)


def resume_model(config: RunConfig, tok: RunCodec, folder: Path) -> GptOssForCausalLM:
    """The model saved in the checkpoint ``folder``, ready to train. With LoRA: the base (:func:`make_model`,
    deterministic) and the saved adapters, not the merged weights (training continues on the adapters)."""
    if config.model.lora is None:
        return for_training(config, load_for(folder, tok, config.rollout.max_seq_len))
    from safetensors.torch import load_file

    model = make_model(config, tok)
    if not (folder / ADAPTER_FILE).is_file():
        raise CheckpointError(f"cannot resume with model.lora: '{folder}' has no {ADAPTER_FILE}")
    device = next(model.parameters()).device
    try:
        load_adapters(model, load_file(folder / ADAPTER_FILE, device=str(device)))
    except ValueError as e:
        raise CheckpointError(f"cannot resume from '{folder}': {e}") from e
    return model


def sft_plan(config: RunConfig) -> str | None:
    """One line saying what the SFT warm start does when it is not the plain default: skipped, or run from
    ``model.init_from`` (whose presence resolves ``sft.steps`` to 0 unless it is given)."""
    steps, init = config.sft.steps, config.model.init_from
    if init is not None and steps > 0:
        return f"SFT warm start: {steps} steps from model.init_from={init} (sft.steps given)"
    if init is not None:
        return f"SFT warm start: none, model.init_from={init} is the warm start (sft.steps=N would run N steps from it)"
    return "SFT warm start: none (sft.steps=0)" if steps == 0 else None


def check_engine(config: RunConfig, model: GptOssForCausalLM) -> str:
    """Fail before any work (and before the run folder exists) when the configured engine cannot run: the embedded
    engine's ``kernel=native`` where the C step cannot run, a vLLM server that does not answer, serves another
    model or lacks a route. Returns what generates, for the run's header: ``decode native (avx2)``, ``decode
    torch`` and why not native, or the vLLM server and its version."""
    e = config.rollout.engine
    if isinstance(e, VllmEngineConfig):
        return check_server(e, model.config, config.rollout.max_seq_len)
    kernel, dtype = e.kernel, _local_dtype(e)
    if kernel == "torch":
        return "decode torch"
    if (device := resolve_device(config.device)).type != "cpu":  # the C step is a CPU path
        if kernel == "native":
            raise ValueError(f"rollout.engine.kernel=native runs on the CPU only, but device={device.type}")
        return f"decode torch (on {device.type})"
    if use_native(kernel, model.config, dtype):  # raises for ``native`` where it cannot run
        return f"decode native ({isa()})"
    return f"decode torch ({native_unsupported(model.config, dtype)})"


def _local_dtype(e: LocalEngineConfig) -> torch.dtype:
    return torch.bfloat16 if e.dtype == "bfloat16" else torch.float32


async def make_engine(
    config: RunConfig, model: GptOssForCausalLM, run_dir: Path | None
) -> tuple[Engine, EpisodeLimits]:
    """The configured engine holding ``model``'s weights (a vLLM server is sent them: policy version 0), and the
    episode limits. ``run_dir`` holds a vLLM server's synced weights (None: a temporary folder)."""
    r, e = config.rollout, config.rollout.engine
    limits = EpisodeLimits(r.max_turns, r.max_new_tokens, r.max_seq_len, r.episode_timeout_s)
    if isinstance(e, VllmEngineConfig):
        sync_dir = Path(e.sync_dir) if e.sync_dir else (run_dir or Path(tempfile.mkdtemp())) / "vllm_weights"
        trained = adapted_names(model) if has_lora(model) else None  # LoRA: later syncs send only those layers
        client = VllmEngine(e, int(model.config.vocab_size), r.max_seq_len, sync_dir, trained=trained)
        await client.sync_weights(merged_model(model).state_dict(), 0)
        return client, limits
    device = resolve_device(config.device)
    engine = LocalEngine(
        model,  # LoRA adapters merged by the engine, which holds only the adapted tensors' merged copies
        max_batch=e.max_batch,
        max_seq_len=r.max_seq_len,
        dtype=_local_dtype(e),
        sinks=config.model.engine_sinks,
        prefix_cache_mib=e.prefix_cache_mib,
        kernel=e.kernel if device.type == "cpu" else "torch",
        device=device,
        # the trainer's own tensors where device and dtype agree, unless the async pipeline samples old versions
        # while the trainer updates them (it replicates the engine as copies)
        share_weights=not config.rl.async_.enabled,
    )
    return engine, limits


def held_out_tasks(config: RunConfig, factory: EnvFactory) -> Sequence[Task]:
    """The tasks of the held-out evaluation (the first ``eval.n_tasks`` of ``eval.split``: test, or validation
    where settings are chosen); an empty split is an error, not a success rate of 0 %."""
    split = config.eval.split
    tasks = factory.tasks(split)[: config.eval.n_tasks]
    if not tasks:
        source = getattr(config.env, "tasks_file", None)
        where = f' (\'{source}\' has no line with "split": "{split}")' if source is not None else ""
        which = "held-out" if split == "test" else split
        raise NoHeldOutTasks(f"env '{factory.name}' has no {which} tasks{where}: nothing to evaluate on")
    return tasks


def held_out_eval(
    config: RunConfig, engine: Engine, factory: EnvFactory, tok: RunCodec, limits: EpisodeLimits
) -> Callable[[], Awaitable[dict[str, float]]]:
    """The held-out evaluation of this run (same tasks, decoding and seed every time), ready to await."""
    tasks = held_out_tasks(config, factory)
    e = config.eval
    return functools.partial(
        evaluate, engine, factory, tok, tasks, limits, e.temperature, e.samples_per_task, config.seed
    )


def open_run(
    config: RunConfig, tok: RunCodec, resume: bool, overwrite: bool = False
) -> tuple[Path, GptOssForCausalLM, Progress | None]:
    """The run folder, the model to continue with and the saved position (None: start from the beginning).

    A fresh run refuses an existing folder; a resume requires one, rewinds its files to the last checkpoint
    and loads the weights saved there.
    """
    if not resume:
        model = make_model(config, tok)  # before the run folder exists: a bad checkpoint leaves nothing behind
        check_sinks(config)
        check_engine(config, model)
        return prepare_run_dir(config, overwrite), model, None
    run_dir = config.output_dir / str(config.run_name)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"cannot resume '{run_dir}': it is not a run folder (no config.yaml)")
    check_sinks(config)
    saved = load_progress(run_dir)  # read and check everything first: a failed resume changes nothing
    cuts = plan_rewind(run_dir, saved)
    model = make_model(config, tok) if saved is None else resume_model(config, tok, saved.model_dir)
    check_engine(config, model)
    if saved is not None and saved.phase == "rl":
        check_rl_start(config, run_dir)  # read later as the reference: a bad one must refuse before the rewind
    rewind_files(run_dir, cuts)
    if saved is None:
        return run_dir, model, None
    saved.state.rngs.restore()
    return run_dir, model, saved


def check_rl_start(config: RunConfig, run_dir: Path) -> None:
    """A one-line :class:`CheckpointError` unless ``checkpoints/sft``, the policy RL started from (what a resumed
    RL phase reads as its reference), is there when the warm start ran and reads as a checkpoint: names and shapes
    against its config (headers only), and with LoRA the adapters' file."""
    sft = run_dir / "checkpoints" / "sft"
    if not sft.exists():
        if config.sft.steps > 0 and config.model.init_from is None:  # else RL would start over from a fresh model
            raise CheckpointError(f"cannot resume '{run_dir}': '{sft}' is missing, and it holds the weights RL "
                                  "started from (the reference policy)")  # fmt: skip
        return
    problem = first_problem(check_checkpoint(sft))
    if problem is None and config.model.lora is not None:
        try:
            with safe_open(str(sft / ADAPTER_FILE), framework="pt") as f:
                f.keys()
        except (OSError, SafetensorError) as e:
            problem = f"its {ADAPTER_FILE} does not read ({e})"
    if problem is not None:
        raise CheckpointError(f"cannot resume '{run_dir}': the RL start '{sft}' is damaged: {problem}")


def rl_start_model(config: RunConfig, run_dir: Path, tok: RunCodec) -> GptOssForCausalLM:
    """The policy as RL began (the reference model of a resumed run): the SFT checkpoint (merged weights, with
    LoRA), else the start."""
    sft = run_dir / "checkpoints" / "sft"
    if (sft / "config.json").is_file():
        model = load_for(sft, tok)
        set_kernel(model, config.model.attention)
        torch.nn.Module.to(model, resolve_device(config.device))  # in place
        return model
    return make_model(config, tok)
