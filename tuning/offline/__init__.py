"""The offline driver: a torch DataLoader replay of the records through the engine, and its result."""
