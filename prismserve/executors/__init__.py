"""Executor backends: the engines that run unit tasks inside replicas."""

from prismserve.executors.base import Batcher, Executor, ExecutorUnhealthy
from prismserve.executors.sim import SimExecutor, SimProfile, synthesize

__all__ = ["Batcher", "Executor", "ExecutorUnhealthy", "SimExecutor", "SimProfile", "synthesize"]
