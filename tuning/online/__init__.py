"""The online driver: a batching server (queue, batcher, workers, one model executor), its responses,
its Prometheus metrics and its HTTP front."""
