"""Drafts past the length budget: positions the real loop evaluates and never emits.

Some generators draft a whole block whatever the length budget, and ``_assisted_decoding`` crops
the accepted tokens to ``max_length`` only after ``_speculative_sampling`` (transformers 5.24.0,
``generation/utils.py``: "drafting several tokens at once with the candidate without capping its
draft (e.g. MTP)"; DFlash computes its cap, ``candidate_generator.py`` line 1587, and only uses it to
skip a round). So the real ``LogitsProcessorList`` runs, in the drafter and on the target's logits,
at positions past ``max_length``, which plain sampling never reaches. On a fixed-logits scenario's
small vocabulary a warper can leave no token there (``no_repeat_ngram_size=1`` bans each token once
used: markov8's 8 are gone after the prompt's 3 and 5 new ones): the processed row is all ``-inf``
and ``torch.multinomial`` raises (in MTP's drafter, or in the verifier on DFlash's bonus row) where
plain sampling has already stopped. That is the scenario's vocabulary running out, not the generator
or the loop failing (a real vocabulary does not run out there), and it made every generate-mode case
of DFlash and MTP under ``no_repeat_ngram_size=1`` an ``error``, and their gates red.

:func:`filling_past_budget` gives such rows zero logits (a uniform law) as the processors leave
them: only for a position at or past ``max_length`` of the target's sequence (``input_ids`` of that
length or longer, starting with the prompt's ids: a drafter with its own tokenizer counts positions
in other tokens, and its rows are left alone), and only rows with no finite entry (after each
processor: a later warper may raise on an empty row, as ``top_h``'s ``Categorical`` does).

**The law of the emitted tokens does not change.** A drafter draws its drafts in order, so a
draft past the budget never shapes one inside it. The verifier draws ``r_i`` for every draft at once
whatever the rows hold, accepts draft ``i`` on its row ``i`` alone, and emits the accepted drafts
then one token drawn from the row of the first rejection (or the bonus row); the loop keeps the
first ``budget`` of them. If the first rejection falls inside the budget, every emitted token is a
function of rows inside it; if not, the emitted tokens are the first ``budget`` drafts, accepted on
rows inside it, and the token drawn from a row past it is cropped. Either way nothing past the
budget is emitted, and no filled row shapes what is. An empty row inside the budget is left as it
is: plain sampling meets it too. The samples a filled row touched are counted in the case's reason.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def filling_past_budget(prompt_ids: torch.Tensor, max_length: int):
    """While active, a ``LogitsProcessorList`` scoring a sequence of the target's (one that starts with
    ``prompt_ids``: a drafter with a tokenizer of its own counts positions in other tokens) at a position
    at or past ``max_length`` gives zero logits to a row that one of its processors leaves with no
    finite logit; yields a list that gets one entry (the rows filled) per call that filled any."""
    from transformers.generation.logits_process import LogitsProcessorList

    real = LogitsProcessorList.__call__
    fills: list[int] = []
    prompt, prompt_length = prompt_ids.cpu(), prompt_ids.shape[-1]

    def processed(self, input_ids, scores, **kwargs):
        if input_ids.shape[-1] < max_length or not torch.equal(input_ids[:, :prompt_length].cpu(), prompt):
            return real(self, input_ids, scores, **kwargs)
        # One processor at a time (each through the real list's call), so that a warper after the
        # one that emptied the row (top_h's Categorical raises on it) gets the filled row.
        filled = 0
        for processor in self:
            scores = real(LogitsProcessorList([processor]), input_ids, scores, **kwargs)
            empty = ~torch.isfinite(scores).any(dim=-1)
            if bool(empty.any()):
                scores = scores.clone()
                scores[empty] = 0.0
                filled += int(empty.sum())
        if filled:
            fills.append(filled)
        return scores

    LogitsProcessorList.__call__ = processed
    try:
        yield fills
    finally:
        LogitsProcessorList.__call__ = real
