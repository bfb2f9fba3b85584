"""The fast-path entries of kernels/indexer and kernels/sparse_attn in the mini reference model (CPU interpreter):
with them in place of the references, decode steps (after a reference prefill: the interpreter is slow) give the
dense-mask logits, with index sharing (freq 2: computing and reuse layers). Top-k near-ties are redrawn, as in
tests/test_model_reference.py. The kernels' prefill paths are tested in tests/test_kernels_*.py."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.kernels.indexer import launcher as index_launcher  # noqa: E402
from m3lab.kernels.sparse_attn import launcher as attn_launcher  # noqa: E402
from m3lab.model import build_model, dense_mask_logits  # noqa: E402
from m3lab.model import decoder  # noqa: E402
from m3lab.spec.model import ModelSpec  # noqa: E402

MARGIN = 1e-3
ATOL = 2e-4


def _fast_paths(monkeypatch) -> dict:
    """Put the fast paths in the decoder's place; returns the count of calls each one served."""
    reference = decoder.attention_varlen
    calls = {"attention": 0, "indexer": 0, "topk": 0}

    def counted(name, fn):
        def run(*args, **kw):
            calls[name] += 1
            return fn(*args, **kw)
        return run

    def attention(*args, blocks=None, **kw):
        if blocks is None:                      # dense layers keep the reference
            return reference(*args, blocks=blocks, **kw)
        return counted("attention", attn_launcher.attention_varlen)(*args, blocks=blocks, **kw)
    monkeypatch.setattr(decoder, "attention_varlen", attention)
    monkeypatch.setattr(decoder, "indexer_varlen", counted("indexer", index_launcher.indexer_varlen))
    monkeypatch.setattr(decoder, "topk_blocks", counted("topk", index_launcher.topk_blocks))
    return calls


def test_mini_model_decode_with_the_fast_paths_matches_dense_mask(monkeypatch):
    cfg = ModelSpec.mini().with_index_sharing(2)
    bs, k = cfg.sparse.block_size, cfg.sparse.topk_blocks
    for _ in range(4):
        seed = int(torch.randint(0, 2**30, ()).item())
        m = build_model(cfg, {"tp": 1, "fused_shared_expert": False}, seed=seed)
        gen = torch.Generator().manual_seed(seed + 1)
        lens = [k * bs + 21, k * bs + 5]                  # longer than topk x block: the choice is sparse
        seqs = [torch.randint(0, cfg.vocab, (n + 2,), generator=gen) for n in lens]
        cache = m.new_cache(32, layout="triton")
        out = m.step(cache, [(0, seqs[0][:lens[0]]), (1, seqs[1][:lens[1]])], all_logits=True)
        got = [[out[:lens[0]]], [out[lens[0]:]]]
        calls = _fast_paths(monkeypatch)
        for d in range(2):
            out = m.step(cache, [(0, seqs[0][lens[0] + d:lens[0] + d + 1]),
                                 (1, seqs[1][lens[1] + d:lens[1] + d + 1])], all_logits=True)
            got[0].append(out[:1])
            got[1].append(out[1:])
        monkeypatch.undo()
        # 3 sparse layers, freq 2: ordinals 0 and 2 compute, 1 reuses; 2 decode steps
        assert calls == {"attention": 6, "indexer": 4, "topk": 4}
        refs = [dense_mask_logits(m, s) for s in seqs]
        if min(margin for _, margin in refs) < MARGIN:
            continue
        for (ref, _), g in zip(refs, got):
            g = torch.cat(g)
            assert g.shape == ref.shape
            assert (g.double() - ref).abs().max().item() < ATOL
        return
    pytest.fail("no input without a top-k near-tie in 4 draws")
