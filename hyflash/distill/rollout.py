"""Batched student rollouts and teacher scoring of the sampled tokens.

Layout of a batch: prompts left-padded to a common length P, responses right-padded to T, so the response
occupies the same columns [P, P+T) in every row and one `logits_to_keep` slice gives the logits that
predicted it. Position ids follow the attention mask, so padding never shifts a row's positions and the
rollout, the student's training pass and the teacher's scoring pass all see the same positions.

Cross-vocabulary teachers score *text*: the student's response is decoded, re-tokenised for the teacher
(prompt and response tokenised separately so the boundary is the same), and each teacher token's
log-prob is credited to the student token whose character span contains the teacher token's last
character. The per-student-token values then sum to the teacher's log-prob of the whole response text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class Rollout:
    prompts: list[str]
    ids: torch.Tensor  # [B, P+T] prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # [B, P+T]
    prompt_len: int  # P
    valid: torch.Tensor  # [B, T] bool: real response tokens (the stop token included)
    sampling_logp: torch.Tensor  # [B, T] log-prob of each token under the distribution it was drawn from
    texts: list[str]  # decoded responses

    @property
    def response(self) -> torch.Tensor:
        return self.ids[:, self.prompt_len :]

    @property
    def num_tokens(self) -> int:
        return int(self.valid.sum())


def pad_id(tokenizer) -> int:
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if value is not None:
            return int(value)
    return 0


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def encode_left_padded(tokenizer, texts: list[str], add_special_tokens: bool = True):
    rows = [tokenizer(t, add_special_tokens=add_special_tokens)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    pad = pad_id(tokenizer)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


def stop_token_ids(tokenizer) -> set[int]:
    """The response ends at the first newline (the taught format) or at end of sequence."""
    stops = {int(i) for i in tokenizer("\n", add_special_tokens=False)["input_ids"][-1:]}
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    return stops


def model_device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    stops: set[int] | None = None,
) -> Rollout:
    """Sample one response per prompt (temperature 0 = greedy), with a KV cache, stopping per row at any of
    `stops` (default: newline or end of sequence). Runs on the model's device; `generator` must live there.

    On an accelerator the "all rows done?" test (a device-to-host sync) runs every few tokens only, so the
    host can queue the next steps; the extra tokens of finished rows are padding and change nothing.
    """
    device = model_device(model)
    ids, mask = (t.to(device) for t in encode_left_padded(tokenizer, prompts))
    batch, prompt_len = ids.shape
    stops = torch.tensor(sorted(stop_token_ids(tokenizer) if stops is None else stops), device=device)
    check_every = 1 if device.type == "cpu" else 4
    pad = pad_id(tokenizer)
    cache = DynamicCache()
    step_ids, step_pos, full_mask = ids, positions(mask), mask
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    out_tokens, out_logp, out_valid = [], [], []
    for step in range(max_new_tokens):
        # Only the last position's logits are used: the prefill need not run the head on the whole prompt.
        out = model(input_ids=step_ids, attention_mask=full_mask, position_ids=step_pos, cache=cache,
                    use_cache=True, logits_to_keep=1)
        cache = out.cache
        logits = out.logits[:, -1].float()
        if temperature == 0:
            token = logits.argmax(-1)
            logp = torch.zeros(batch, device=device)
        else:
            logp_all = torch.log_softmax(logits / temperature, -1)
            token = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
        token = torch.where(done, torch.full_like(token, pad), token)
        out_tokens.append(token)
        out_logp.append(torch.where(done, torch.zeros_like(logp), logp))
        out_valid.append(~done)
        done = done | torch.isin(token, stops)
        if step % check_every == check_every - 1 and bool(done.all()):
            break
        step_ids, step_pos = token[:, None], step_pos[:, -1:] + 1
        # Finished rows keep running on pad tokens (their outputs are discarded), so the mask stays all ones.
        full_mask = torch.cat([full_mask, torch.ones(batch, 1, dtype=full_mask.dtype, device=device)], dim=1)
    response = torch.stack(out_tokens, 1)
    valid = torch.stack(out_valid, 1)
    return Rollout(
        prompts=list(prompts),
        ids=torch.cat([ids, response], 1),
        attention_mask=torch.cat([mask, valid.long()], 1),
        prompt_len=prompt_len,
        valid=valid,
        sampling_logp=torch.stack(out_logp, 1),
        texts=decode_responses(tokenizer, response, valid),
    )


def decode_responses(tokenizer, response: torch.Tensor, valid: torch.Tensor) -> list[str]:
    """Texts of the valid tokens per row, from one host copy of the batch (not one sync per row)."""
    rows, keep = response.tolist(), valid.tolist()
    return [tokenizer.decode([t for t, k in zip(r, v) if k], skip_special_tokens=True) for r, v in zip(rows, keep)]


def response_logits(model, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Logits [B, T, V] that predict the response tokens (columns prompt_len..end), with gradient if enabled."""
    t = ids.shape[1] - prompt_len
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), logits_to_keep=t + 1)
    return out.logits[:, :-1]


SCORING_LOGITS_BYTES = 1 << 28  # float32 logits held at once while scoring (256 MiB)


@torch.no_grad()
def teacher_scores(teacher, rollout: Rollout, full: bool = False, rows_per_chunk: int | None = None):
    """Teacher log-probs of the sampled tokens [B, T] and, when `full`, its logits [B, T, V] (float32).

    Runs `rows_per_chunk` rows at a time so a large vocabulary (Gemma's 262k) keeps memory bounded; by
    default as many rows as fit SCORING_LOGITS_BYTES (about 40 rows of 32 tokens with SmolLM2's 49k).
    """
    if rows_per_chunk is None:
        vocab = teacher.get_output_embeddings().weight.shape[0]
        width = max(rollout.ids.shape[1] - rollout.prompt_len, 1)
        rows_per_chunk = max(1, SCORING_LOGITS_BYTES // (4 * vocab * width))
    token_logp, logits_out = [], []
    for start in range(0, rollout.ids.shape[0], rows_per_chunk):
        sl = slice(start, start + rows_per_chunk)
        logits = response_logits(teacher, rollout.ids[sl], rollout.attention_mask[sl], rollout.prompt_len).float()
        logp = torch.log_softmax(logits, -1).gather(-1, rollout.response[sl].unsqueeze(-1)).squeeze(-1)
        token_logp.append(logp)
        if full:
            logits_out.append(logits)
    token_logp = torch.cat(token_logp).masked_fill(~rollout.valid, 0.0)
    return token_logp, (torch.cat(logits_out) if full else None)


# ----- cross-vocabulary scoring ---------------------------------------------------------------------------
def token_char_spans(tokenizer, tokens: list[int]) -> list[tuple[int, int]]:
    """Character span of each token inside decode(tokens), from the lengths of cumulative decodes."""
    spans, prev = [], 0
    for i in range(len(tokens)):
        end = len(tokenizer.decode(tokens[: i + 1], skip_special_tokens=True))
        spans.append((prev, max(end, prev)))
        prev = max(end, prev)
    return spans


def credit_by_spans(
    student_spans: list[tuple[int, int]], teacher_ends: list[int], teacher_values: list[float]
) -> list[float]:
    """Sum each teacher value into the student token whose span (start, end] holds the teacher token's end.

    Teacher tokens ending at or before the first student character go to the first student token and those
    past the last student character to the last one, so nothing is lost and the totals always agree.
    """
    out = [0.0] * len(student_spans)
    if not out:
        return out
    j = 0
    for end, value in sorted(zip(teacher_ends, teacher_values), key=lambda x: x[0]):
        while j < len(student_spans) - 1 and end > student_spans[j][1]:
            j += 1
        out[j] += value
    return out


@torch.no_grad()
def teacher_scores_cross_vocab(teacher, teacher_tokenizer, student_tokenizer, rollout: Rollout) -> torch.Tensor:
    """Teacher log-probs credited to the student's tokens [B, T] when the vocabularies differ."""
    device = model_device(teacher)
    result = torch.zeros(rollout.valid.shape, device=rollout.valid.device)
    responses, valid = rollout.response.tolist(), rollout.valid.tolist()
    for row in range(rollout.ids.shape[0]):
        tokens = [t for t, keep in zip(responses[row], valid[row]) if keep]
        if not tokens:
            continue
        text = student_tokenizer.decode(tokens, skip_special_tokens=True)
        prompt_ids = teacher_tokenizer(rollout.prompts[row])["input_ids"]
        enc = teacher_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        resp_ids = enc["input_ids"]
        if not resp_ids:  # the response decodes to nothing (e.g. only a stop token): no teacher signal
            continue
        ids = torch.tensor([prompt_ids + resp_ids], device=device)
        logits = response_logits(teacher, ids, torch.ones_like(ids), len(prompt_ids)).float()[0]
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids):, None]).squeeze(-1)
        ends = [e for _, e in enc["offset_mapping"]]
        credited = credit_by_spans(token_char_spans(student_tokenizer, tokens), ends, logp.tolist())
        result[row, : len(tokens)] = torch.tensor(credited, device=result.device)
    return result
