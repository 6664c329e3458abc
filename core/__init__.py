"""The Flower-free core of fedroute: the routing maths both runtimes drive.

Nothing here imports Flower or torch (``tests/test_core.py`` checks it): routing
settings and named methods, the routing draws, the controllers, EXP3, the entry
test, the per-client agent step and client round, the server step (aggregation
with the influence bounds, the federation's state), the task protocol and the
evaluation metrics.  The Flower ``ClientApp``/``Strategy`` (:mod:`fedroute.client`,
:mod:`fedroute.strategies`) and the batched simulator (:mod:`fedroute.simulation`)
are thin layers over these functions.
"""
