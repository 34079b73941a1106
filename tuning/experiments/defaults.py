"""The defaults the command line shows before anything runs (the p99 target, the objectives, the output
folder), in a module that imports nothing: ``--help``, ``--version`` and a usage error load no numeric library.
The engine and the investigation take them from here."""

DEFAULT_TARGET_P99_MS = 800.0  # the investigation's p99 target, one for every command
OBJECTIVES = ("target", "qps")  # capacity at the p99 target (open loop), or closed-loop throughput
DEFAULT_OUT = "investigation"  # investigate's output folder
