"""pipesim: a discrete-event simulator of pipeline bubbles and all-reduce cost in LLM
inference engines, for any TP x PP split and concurrency."""

from .api import predict, run
from .errors import UserError
from .metrics import Result
from .scenario import Scenario, build_scenario
from .sweep import search, sweep

__all__ = ["predict", "run", "sweep", "search", "build_scenario", "Scenario", "Result", "UserError"]
__version__ = "0.1.0"
