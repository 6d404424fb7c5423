"""Child processes: launching and reaping ranks, the rank programs, the rank session, and the
isolation of study trials. Internal; the public entry points are :func:`autotune.measure` and
:class:`autotune.procs.session.RankSession`.
"""
