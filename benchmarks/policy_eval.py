"""How the shipped pretrained policy does on the simulator, against always-keep and random.

Mean undiscounted return over seeded episodes: per shipped profile (budget drawn per episode),
with domain randomization (synthetic models and machines the policy never saw exactly), and on
several ranks, where the ZeRO action is live.

Run: python benchmarks/policy_eval.py [--episodes 100] [--policy policies/pretrained]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
from autotune.envs import SimulatedEnv, WorkloadProfile, shipped_profiles
from autotune.envs._codec import Move
from autotune.policies.ppo import EPISODE_STEPS, PRETRAINED_DIR, RANK_CHOICES, evaluate, load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--policy", type=Path, default=PRETRAINED_DIR)
    args = parser.parse_args()
    policy = load_policy(args.policy)
    print(f"policy: {args.policy} ({policy.metadata['timesteps']} PPO steps on {policy.metadata['trained_on']})")
    print(f"{'environment':<28} {'policy':>8} {'keep':>8} {'random':>8}")
    shipped = shipped_profiles()
    settings: list[tuple[str, list[WorkloadProfile] | None, bool, int | tuple[int, ...]]] = [
        (p.workload, [p], False, 1) for p in shipped
    ]
    settings += [("randomized, 1 rank", None, True, 1), ("randomized, 1-8 ranks", None, True, RANK_CHOICES)]
    settings += [
        (f"{p.workload}, 4 ranks", [p], False, 4) for p in shipped if p.workload in ("gpt-tiny", "resnet-tiny")
    ]
    for label, profiles, randomize, ranks in settings:
        env = gym.wrappers.TimeLimit(
            SimulatedEnv(profiles=profiles, randomize=randomize, ranks=ranks, horizon=EPISODE_STEPS),
            max_episode_steps=EPISODE_STEPS,
        )
        rng = np.random.default_rng(0)

        def random_action(_: np.ndarray, rng: np.random.Generator = rng) -> np.ndarray:
            return rng.integers(0, [3, 3, 3, 3, 4, 3, 3])  # the action space

        scores = [
            evaluate(fn, env, episodes=args.episodes, seed=10_000)
            for fn in (policy.act, lambda o: np.array(Move.KEEP.action), random_action)
        ]
        print(f"{label:<28} {scores[0]:>8.2f} {scores[1]:>8.2f} {scores[2]:>8.2f}")


if __name__ == "__main__":
    main()
