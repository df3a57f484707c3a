"""Turns a scheduler plan into tensors, runs the model, returns logits for sampling rows.

Tokens of one step are laid out group by group, so attention can batch each group
while the matrix products see one flat, unpadded batch. Requests with at most
``ROW_ATTENTION_MAX`` new tokens (decodes, and decodes with draft tokens to verify)
come first, as one group of *rows*: each new token is its own query over its own
causal context (the tokens before it, the step's earlier ones included, all written
to the pool before attention runs). The decode kernel then attends for the whole
step in one call, reading keys and values where they lie, instead of a padded
gather of every context per layer for each draft length. Longer chunks (prompts), and
short ones deep in a long prompt, are grouped by length for batched attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from llmserve.models.attention import AttentionMetadata, build_group
from llmserve.models.llama import LlamaForCausalLM

# New tokens of a request up to which its rows attend one by one (a draft of up to 15).
ROW_ATTENTION_MAX = 16
# ... and a prompt chunk's only while its context is this short: each row reads the whole
# context, where a grouped chunk gathers it once (SmolLM2, 16-token chunks, in process:
# equal at 2k, grouped 0.6x the time at 4k and 0.5x at 5.6k)
ROW_CHUNK_CONTEXT = 2048


@dataclass(slots=True)
class RunOutput:
    logits: torch.Tensor  # [num_sample_rows, vocab]
    # request_id -> (first row in logits, number of rows): 1 + number of draft tokens
    rows: dict[str, tuple[int, int]]


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv: KVCacheManager, kv_dtype: torch.dtype = torch.float32,
                 lora=None) -> None:
        """``lora``: the engine's ``LoraManager`` when it serves adapters."""
        self.model = model
        self.lora = lora
        self.kv = kv
        self.block_size = kv.block_size
        # a block table per KV group where the manager keeps the model's groups (a draft
        # model's mirror pool keeps one table for all its layers)
        grouped = kv.windows == model.kv_layout.windows
        self.kv_caches = model.allocate_kv_cache(kv.num_blocks, kv.block_size, kv_dtype, grouped=grouped)
        self.n_rep = model.num_heads // model.num_kv_heads

    def execute(self, plan: SchedulerOutput) -> RunOutput:
        bs = self.block_size
        slot_of = self.lora.activate({s.request.lora_id for s in plan.scheduled} - {0}) if self.lora is not None else {}
        row_slots: list[int] = []  # each token's adapter slot (-1: none)
        by_len: dict[int, list[ScheduledRequest]] = {}
        for s in plan.scheduled:
            q_len = s.num_tokens + len(s.spec_token_ids)
            rowwise = q_len <= ROW_ATTENTION_MAX and (
                s.num_tokens == 1 or s.request.num_computed_tokens + q_len <= ROW_CHUNK_CONTEXT)
            by_len.setdefault(1 if rowwise else q_len, []).append(s)

        num_groups = self.kv.num_groups
        ids: list[int] = []
        positions: list[int] = []
        slots: list[list[int]] = [[] for _ in range(num_groups)]  # per KV group
        groups: list[list] = [[] for _ in range(num_groups)]
        sample_rows: list[int] = []
        rows: dict[str, tuple[int, int]] = {}
        for key in sorted(by_len):
            members = by_len[key]
            if slot_of:  # an adapter's rows side by side: one segment per adapter (LoraSlots.begin_step)
                members.sort(key=lambda s: slot_of.get(s.request.lora_id, -1))
            start = len(ids)
            ctx_lens: list[int] = []
            tables: list[list[list[int]]] = [[] for _ in range(num_groups)]
            for s in members:
                req = s.request
                c = req.num_computed_tokens
                tokens = req.all_token_ids[c:c + s.num_tokens] + s.spec_token_ids
                q_len = len(tokens)
                # plain lists, one tensor each at the end: per-request tensor ops cost more than this
                positions.extend(range(c + req.rope_offset, c + q_len + req.rope_offset))
                row0 = len(ids)
                ids.extend(tokens)
                row_slots.extend([slot_of.get(req.lora_id, -1)] * q_len)
                rows_of = q_len if key == 1 else 1  # one query row per token, each over its own context
                ctx_lens.extend(range(c + 1, c + q_len + 1) if key == 1 else [c + q_len])
                for g, table in enumerate(self.kv.block_tables(req.request_id)):
                    slots[g].extend(table[p // bs] * bs + p % bs for p in range(c, c + q_len))
                    tables[g].extend([table] * rows_of)
                if s.sample:
                    n_rows = 1 + len(s.spec_token_ids)
                    rows[req.request_id] = (len(sample_rows), n_rows)
                    sample_rows.extend(range(row0 + q_len - n_rows, row0 + q_len))
            for g in range(num_groups):
                groups[g].append(build_group(start, key, ctx_lens, tables[g], bs, self.n_rep))

        metas = [AttentionMetadata(torch.tensor(slots[g], dtype=torch.long), groups[g]) for g in range(num_groups)]
        meta = metas if num_groups > 1 else metas[0]
        input_ids = torch.tensor(ids, dtype=torch.long)
        pos_t = torch.tensor(positions, dtype=torch.long)
        if self.lora is not None:
            self.lora.slots.begin_step(row_slots)
        try:
            hidden = self.model.forward(input_ids, pos_t, meta, self.kv_caches)
        finally:
            if self.lora is not None:
                self.lora.slots.end_step()
        if sample_rows:
            if sample_rows != list(range(hidden.shape[0])):
                hidden = hidden.index_select(0, torch.tensor(sample_rows, dtype=torch.long))
            logits = self.model.compute_logits(hidden)
        else:
            logits = torch.empty(0, self.model.config.vocab_size)
        return RunOutput(logits, rows)
