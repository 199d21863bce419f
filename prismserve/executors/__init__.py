"""Executor backends: the engines that run unit tasks inside replicas."""

from prismserve.executors.base import AsyncBatcher, Executor, ExecutorUnhealthy
from prismserve.executors.sim import SimExecutor, SimProfile, synthesize

__all__ = ["AsyncBatcher", "Executor", "ExecutorUnhealthy", "SimExecutor", "SimProfile", "synthesize"]
