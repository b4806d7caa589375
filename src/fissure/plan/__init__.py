"""Optimizers: pure functions from operator statistics or profiles to configurations."""

from fissure.plan.planners import METHODS, PlanResult, plan_chain

__all__ = ["METHODS", "PlanResult", "plan_chain"]
