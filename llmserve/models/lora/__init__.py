"""LoRA adapters over the decoder: read from disk (``adapter``, ``peft_format``, ``gguf_format``)
and applied per row in one step from stacked slots (``slots``)."""
