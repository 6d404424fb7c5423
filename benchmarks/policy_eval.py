"""How the shipped pretrained policy does on the simulator, against always-keep and random.

Mean undiscounted return over seeded episodes: per shipped profile (budget drawn per episode),
and with domain randomization (synthetic models and machines the policy never saw exactly).

Run: python benchmarks/policy_eval.py [--episodes 100] [--policy policies/pretrained]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
from autotune.envs import SimulatedEnv, shipped_profiles
from autotune.policies.ppo import PRETRAINED_DIR, evaluate, load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--policy", type=Path, default=PRETRAINED_DIR)
    args = parser.parse_args()
    policy = load_policy(args.policy)
    print(f"policy: {args.policy} ({policy.metadata['timesteps']} PPO steps on {policy.metadata['trained_on']})")
    print(f"{'environment':<28} {'policy':>8} {'keep':>8} {'random':>8}")
    settings = [(p.workload, [p], False) for p in shipped_profiles()] + [("randomized", None, True)]
    for label, profiles, randomize in settings:
        env = gym.wrappers.TimeLimit(SimulatedEnv(profiles=profiles, randomize=randomize), max_episode_steps=16)
        rng = np.random.default_rng(0)

        def random_action(_: np.ndarray, rng: np.random.Generator = rng) -> np.ndarray:
            return rng.integers(0, [3, 3, 3, 3, 4])

        scores = [
            evaluate(fn, env, episodes=args.episodes, seed=10_000)
            for fn in (policy.act, lambda o: np.array([1, 1, 1, 1, 0]), random_action)
        ]
        print(f"{label:<28} {scores[0]:>8.2f} {scores[1]:>8.2f} {scores[2]:>8.2f}")


if __name__ == "__main__":
    main()
