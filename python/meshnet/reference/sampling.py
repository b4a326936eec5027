"""Token sampling at the last hop: greedy, temperature, top-k, top-p, seeded.

One `Sampler` per route session (it owns the session's random generator), called on the
thread that runs the session's steps. Greedy (temperature 0) is exactly argmax.
"""

from __future__ import annotations

import torch

from meshnet.wire.seam import SamplingParams, SampledToken, TokenLogprob


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        if params.temperature < 0 or not 0 <= params.top_p <= 1:
            raise ValueError(f"bad sampling parameters {params}")
        self.params = params
        self._generator = torch.Generator().manual_seed(params.seed)

    def sample(self, logits: torch.Tensor, position: int) -> SampledToken:
        logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
        p = self.params
        if p.temperature == 0:
            token = int(torch.argmax(logits))
        else:
            scores = logits.to(torch.float32) / p.temperature
            if p.top_k:
                kth = torch.topk(scores, min(p.top_k, scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if 0 < p.top_p < 1:
                ordered, index = torch.sort(scores, descending=True)
                cumulative = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1)
                drop = cumulative - torch.softmax(ordered, dim=-1) > p.top_p
                scores[index[drop]] = float("-inf")
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self._generator))
        top = ()
        if p.top_logprobs:
            values, ids = torch.topk(logprobs, min(p.top_logprobs, logprobs.numel()))
            top = tuple(TokenLogprob(int(i), float(v)) for v, i in zip(values, ids))
        return SampledToken(token, position, float(logprobs[token]), top)
