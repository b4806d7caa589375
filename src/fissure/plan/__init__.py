"""Planners and plans: which plan a program runs with, from the models, profiles and stored calibration."""

from fissure.plan.planners import METHODS, PlanResult, plan_chain

__all__ = ["METHODS", "PlanResult", "plan_chain"]
