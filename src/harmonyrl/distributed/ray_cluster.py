"""Starting the env workers on a Ray cluster: connect, place, spawn, wait until ready — or fail in one line.

    factory = start_env_pool(config.scale, functools.partial(make_factory, config.env, seed), local_factory)

1. **Connect.** ``scale.address`` null starts a local cluster for this run (no dashboard, usage stats and token
   auth off unless the environment sets ``RAY_USAGE_STATS_ENABLED`` / ``RAY_AUTH_MODE``); ``HOST:PORT`` or
   ``ray://HOST:PORT`` joins an existing one, after a TCP probe, and gives up after ``scale.start_timeout_s``
   (Ray's own connect retries for minutes when nothing answers or something else does); ``auto`` joins the
   cluster this machine belongs to. A
   process already connected (a Ray job's driver, a notebook) keeps its connection and ``scale.address`` is
   not used; the pool then leaves that connection open when it closes.
2. **Place.** One placement group, one bundle of ``scale.worker_cpus`` CPUs per worker, SPREAD over the nodes
   (or PACK). A cluster that cannot hold the bundles within the timeout is a one-line error naming what was
   asked and what the cluster has, instead of a run that waits forever.
3. **Spawn** one :class:`~harmonyrl.distributed.ray_worker.EnvWorker` actor per bundle, each running at most
   ``scale.worker_concurrency`` env calls at a time and restarted by Ray up to ``scale.max_restarts`` times.
   Env calls are never retried (``max_task_retries=0``): a retried step could run a tool twice.
4. **Wait** for every worker to have built its factory: a worker that cannot (no bubblewrap on its node, a
   missing tasks file) stops the run here, before any compute.

Every failure of these steps is a :class:`~harmonyrl.errors.ClusterError` (one line, no traceback) and leaves
no actor, placement group or local cluster behind.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from harmonyrl.config import ScaleConfig
from harmonyrl.distributed.ray_envs import EnvPool, RayEnvFactory
from harmonyrl.distributed.ray_worker import EnvWorker, FactoryRecipe
from harmonyrl.envs.base import EnvFactory
from harmonyrl.errors import ClusterError

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from harmonyrl.distributed.ray_envs import Worker


def import_ray() -> ModuleType:
    """Ray, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "scale.ray=true needs the optional 'ray' package: pip install 'harmonyrl[ray]' (or set scale.ray=false)"
        ) from None
    return ray


def probe(address: str, timeout_s: float) -> None:
    """Fail in one line unless something accepts a TCP connection at ``address`` (``[ray://]HOST:PORT``)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except OSError as e:
        reason = f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError) else (e.strerror or repr(e))
    raise ClusterError(f"scale.address={address}: no Ray cluster answers there ({reason})")


def connect(ray: ModuleType, scale: ScaleConfig) -> bool:
    """Connect this process to the cluster; True when this call opened the connection (and must close it)."""
    if ray.is_initialized():
        return False
    init = functools.partial(ray.init, include_dashboard=False, logging_level="WARNING", log_to_driver=True)
    try:
        if scale.address is None:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a cluster of this run alone, on this machine
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            init(address="local")  # "local": a new cluster even when RAY_ADDRESS is set
        elif scale.address == "auto":
            init(address="auto")
        else:
            probe(scale.address, scale.start_timeout_s)
            bounded(functools.partial(init, address=scale.address), scale.address, scale.start_timeout_s)
    except ClusterError:
        raise
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
        where = scale.address or "a local cluster"
        raise ClusterError(f"scale.address: cannot use {where}: {str(e).strip().splitlines()[0]}") from None
    return True


def bounded(init: Callable[[], object], address: str, timeout_s: float) -> None:
    """``init()`` (``ray.init`` joining ``address``), given up after ``timeout_s``: something that accepts TCP
    but is not a Ray head (a proxy, another service) makes Ray retry for minutes. It runs in a daemon thread,
    which is left behind on a timeout: the run stops there, so nothing else uses the half-made connection."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            init()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, name="harmonyrl-ray-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        atexit.register(_exit_before_teardown, thread)
        raise ClusterError(f"scale.address={address}: no Ray cluster answered there within {timeout_s:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _exit_before_teardown(thread: threading.Thread) -> None:
    """At exit, with the abandoned ``ray.init`` still inside Ray's C++ core: end the process now, with the exit
    code of a user error (the run stopped on this :class:`ClusterError`). Letting the interpreter tear down under
    that thread aborted the process now and then (``std::bad_alloc``, exit -6) after the one-line error."""
    if thread.is_alive():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)


def place(ray: ModuleType, scale: ScaleConfig) -> PlacementGroup:
    """One placement group with a bundle per env worker, ready, or a one-line error after the timeout."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"CPU": scale.worker_cpus} for _ in range(scale.env_workers)]
    group: PlacementGroup = placement_group(bundles, strategy=scale.placement.upper())
    if group.wait(timeout_seconds=scale.start_timeout_s):
        return group
    remove_placement_group(group)
    have = ray.cluster_resources().get("CPU", 0.0)
    raise ClusterError(
        f"scale: {scale.env_workers} env workers × {scale.worker_cpus:g} CPU could not be placed within "
        f"{scale.start_timeout_s:g} s (the cluster has {have:g} CPUs); lower scale.env_workers or scale.worker_cpus"
    )


def spawn(ray: ModuleType, scale: ScaleConfig, group: PlacementGroup, recipe: FactoryRecipe) -> list[Worker]:
    """One env worker actor per bundle of ``group``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor = ray.remote(EnvWorker)
    return [
        actor.options(
            num_cpus=scale.worker_cpus,
            max_concurrency=scale.worker_concurrency,
            max_restarts=scale.max_restarts,
            max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
        ).remote(recipe)
        for i in range(scale.env_workers)
    ]


def wait_ready(ray: ModuleType, workers: Sequence[Worker], timeout_s: float) -> None:
    """Every worker has built its env factory, or a one-line error with the first one's reason."""
    from ray.exceptions import GetTimeoutError, RayError

    try:
        ray.get([w.ready.remote() for w in workers], timeout=timeout_s)
    except GetTimeoutError:
        raise ClusterError(f"scale: the env workers did not start within {timeout_s:g} s") from None
    except RayError as e:
        raise ClusterError(f"scale: an env worker could not build the environment: {_last_line(e)}") from None


def _last_line(error: Exception) -> str:
    """The line of a Ray error that says what went wrong (its traceback's last non-empty line)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


class Cluster:
    """What a pool holds on the cluster, released when the run ends."""

    def __init__(self, ray: ModuleType, group: PlacementGroup, owns_connection: bool) -> None:
        self.ray, self.group, self.owns_connection = ray, group, owns_connection

    def release(self, workers: Sequence[Worker]) -> None:
        """Kill the workers, remove the placement group, and disconnect (stopping a local cluster) if ours."""
        from ray.util.placement_group import remove_placement_group

        for worker in workers:
            self.ray.kill(worker)
        remove_placement_group(self.group)
        if self.owns_connection:
            self.ray.shutdown()


def start_env_pool(scale: ScaleConfig, recipe: FactoryRecipe, local: EnvFactory) -> RayEnvFactory:
    """An env factory whose envs live in ``scale.env_workers`` Ray actors, each building its factory from
    ``recipe``; ``local`` (the same env built here) answers the task lists. See the module docstring."""
    ray = import_ray()
    owns = connect(ray, scale)
    group: PlacementGroup | None = None
    workers: list[Worker] = []
    try:
        group = place(ray, scale)
        workers = spawn(ray, scale, group, recipe)
        wait_ready(ray, workers, scale.start_timeout_s)
    except BaseException:
        if group is not None:
            Cluster(ray, group, owns).release(workers)
        elif owns:
            ray.shutdown()
        raise
    return RayEnvFactory(EnvPool(workers, functools.partial(Cluster(ray, group, owns).release, workers)), local)
