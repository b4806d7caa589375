"""Where `fissure calibrate` stores the measured constants, and how the planner finds them.

Path: `$FISSURE_CALIBRATION` if set (a file), else `$XDG_CONFIG_HOME/fissure/calibration.json`,
else `~/.config/fissure/calibration.json`. One file per deployment: point FISSURE_CALIBRATION at
another file to keep several (a laptop's local[*], a cluster). Without a file the Spark model
uses its documented defaults (fissure.model.spark_model.SparkConstants).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from fissure.model.calibration import Calibration
from fissure.model.spark_model import SparkConstants, SparkWorkload

log = logging.getLogger(__name__)

ENVIRONMENT_VARIABLE = "FISSURE_CALIBRATION"


def calibration_path() -> Path:
    explicit = os.environ.get(ENVIRONMENT_VARIABLE)
    if explicit:
        return Path(explicit)
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config_home) / "fissure" / "calibration.json"


def load_calibration(path: str | os.PathLike | None = None) -> Calibration | None:
    """The stored calibration, or None when there is none (an unreadable one is logged, not raised)."""
    target = Path(path) if path is not None else calibration_path()
    if not target.exists():
        return None
    try:
        return Calibration.from_dict(json.loads(target.read_text()))
    except (OSError, ValueError) as error:
        log.warning("calibration %s unusable (%s); using the default constants", target, error)
        return None


def save_calibration(calibration: Calibration, path: str | os.PathLike | None = None) -> Path:
    target = Path(path) if path is not None else calibration_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(target.suffix + ".tmp")
    temporary.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
    os.replace(temporary, target)
    return target


def stored_spark_model(path: str | os.PathLike | None = None):
    """SparkModelSettings from the stored calibration, or the defaults; and which (no path: it
    goes into benchmark results)."""
    from fissure.plan.spark_chain import SparkModelSettings

    calibration = load_calibration(path)
    if calibration is None:
        return SparkModelSettings(SparkConstants(), SparkWorkload()), "defaults (no calibration stored)"
    where = f"stored calibration of {calibration.measured_at or 'unknown date'} ({calibration.master or 'unknown master'})"
    return SparkModelSettings(calibration.spark, SparkWorkload(batch_records=calibration.batch_records)), where
