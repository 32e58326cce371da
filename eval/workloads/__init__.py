"""Workload generators: traces (`common.trace`) drawn from the statistics papers publish.

Each family of workloads has its own module, with the sources of its numbers beside them:
`swe` (SWE-bench after Continuum's Table 2, and long SWE-bench programs after public
mini-swe-agent runs), `bfcl` (BFCL multi-turn, Continuum's Table 2), `infercept` (the six
augmentations of InferCept's Table 1, mixed), `ampd` (AMPD's Table 1). They share the fitted
distributions (`distributions`), the arrival processes (`arrivals`) and the way a program of a
given shape is drawn (`shapes`); `registry` names them (``TRACES``) and loads a trace by name
or file (``load_or_generate``). Recorded agent runs become traces through `importers`, one
module per trajectory format.

Arrivals are seeded from a different stream than program contents, so the same seed gives the
same programs at every load (``jps``): sweeps over load compare like with like.
"""
