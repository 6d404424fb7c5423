"""Gymnasium environments over the training loop (installed as ``autotune.envs``).

- ``autotune/Training-v0`` (``autotune.envs.training.TrainingEnv``, imports torch): the real
  loop; knobs change while it trains.
- ``autotune/Simulated-v0`` (:class:`SimulatedEnv`): the same spaces and reward over a cost model
  calibrated from a measured profile (``autotune profile``); cheap enough for PPO.

Importing this package registers both with Gymnasium; ``gymnasium`` is in the base install.
"""

from __future__ import annotations

from autotune.envs.calibration import BlockCost, WorkloadProfile, calibrate, load_profile, save_profile
from autotune.envs.core import Interval, MachineDescriptor, ModelDescriptor, TuningEnv
from autotune.envs.simulated import PROFILE_DIR, SimulatedEnv, shipped_profiles
from gymnasium.envs.registration import register, registry

from autotune.tuning import TUNING

__all__ = [
    "PROFILE_DIR",
    "BlockCost",
    "Interval",
    "MachineDescriptor",
    "ModelDescriptor",
    "SimulatedEnv",
    "TuningEnv",
    "WorkloadProfile",
    "calibrate",
    "load_profile",
    "save_profile",
    "shipped_profiles",
]

HORIZON = TUNING.horizon

if "autotune/Training-v0" not in registry:
    register(
        id="autotune/Training-v0",
        entry_point="autotune.envs.training:TrainingEnv",
        max_episode_steps=HORIZON,
        kwargs={"horizon": HORIZON},
        nondeterministic=True,  # real timings: the same seed does not give the same rewards
    )

if "autotune/Simulated-v0" not in registry:
    register(
        id="autotune/Simulated-v0",
        entry_point="autotune.envs.simulated:SimulatedEnv",
        max_episode_steps=HORIZON,
        kwargs={"horizon": HORIZON},
    )
