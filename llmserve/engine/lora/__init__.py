"""LoRA adapters in the engine: which are known, loaded and resident (``manager``), the pure
choice of slots for a step (``residency``), and the commands the clients send (``ops``)."""
