"""The model call: the embedded encoder, bring-your-own models and tokenizers, graph capture, and the engine
that turns a batch of inputs into embeddings on a device."""
