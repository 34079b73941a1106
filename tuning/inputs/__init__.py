"""Requests before the model: records and their errors, readers of every data format, tokenizers, length buckets."""
