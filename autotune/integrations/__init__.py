"""Adaptive tuning inside other frameworks' training loops: Hugging Face ``Trainer``
(:mod:`autotune.integrations.hf`) and Lightning (:mod:`autotune.integrations.lightning`).

Each module imports its framework on first use and says which package to install if it is missing.
"""
