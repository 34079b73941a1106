"""Load generators: closed and open loop against an in-process server, a pipe or any URL, their result,
and the locust engine for an outside cross-check."""
