"""The study specs (``NAME.toml``) shipped with autotune: data only, installed as ``autotune.studies``
(see :func:`autotune.search.spec.shipped_spec`)."""
