"""LoRA adapters over the decoder: read from disk (``read``: ``peft_format``, ``gguf_format``, both checked by ``adapter``)
and applied per row in one step from stacked slots (``slots``)."""
