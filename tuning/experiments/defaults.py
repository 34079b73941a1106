"""The defaults the command line shows before anything runs (the p99 target, the objectives, the output
folder), in a module that imports nothing: ``--help``, ``--version`` and a usage error load no numeric library.
The engine and the investigation take them from here."""

DEFAULT_TARGET_P99_MS = 800.0  # the investigation's p99 target, one for every command
OBJECTIVES = ("target", "qps")  # capacity at the p99 target (open loop), or closed-loop throughput
DEFAULT_OUT = "investigation"  # investigate's output folder
# The open loop's cap on requests in flight on the client, for the engine's windows and `loadtest --rate` alike:
# an open loop is meant to send at the scheduled arrival whatever the server's latency, so the cap is set far above
# rate x latency at the rates one client process sends (a batching server fills its batches only from requests in
# flight; a cap of 8 would hold every batch at 8 and measure the client). Where it binds, the result's send lag says so.
OPEN_LOOP_IN_FLIGHT = 256
CLOSED_LOOP_CLIENTS = 8  # loadtest's closed loop without --concurrency
# investigate's hold of the claimed capacity on a service (--verify), seconds: minutes, so that a queue that settles
# slowly near the ceiling, or a pace that falls as the queue grows, shows before the claim is shipped
VERIFY_S_QUICK = 60.0
VERIFY_S_FULL = 180.0
