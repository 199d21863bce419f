"""The control loops that change a running deployment: re-planning as the traffic drifts,
per-stage autoscaling, SLO accounting, and their periodic driver — typed against the runtime's
control interface (`RuntimeControl`), below the gateway, which feeds and shows them."""

from prismserve.control.autoscale import Autoscaler, AutoscaleStatus
from prismserve.control.controls import Controls
from prismserve.control.periodic import Periodic
from prismserve.control.replan import Replanner, ReplanStatus, total_variation
from prismserve.control.runtime_control import RuntimeControl
from prismserve.control.slo import SLOWindow
from prismserve.planner import Plan

__all__ = [
    "AutoscaleStatus",
    "Autoscaler",
    "Controls",
    "Periodic",
    "Plan",
    "ReplanStatus",
    "Replanner",
    "RuntimeControl",
    "SLOWindow",
    "total_variation",
]
