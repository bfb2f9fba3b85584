"""Gates for kernels/indexer and kernels/sparse_attn, and the random paged problems they (and the vLLM
sparse gates, the tests and the benchmark) run on.

A :class:`PagedProblem` is R requests of different lengths, each with its last ``q_len`` positions as query
rows (decode: 1, verification: 1 + k, prefill chunk: many), K/V and index keys in paged caches whose block
tables point to physical blocks in random order. Cache slots no request has written (the tails of last
blocks and the spare blocks) hold NaN, so a kernel that reads past a context shows it.

CPU (interpreter): fp32 queries and keys, block 16/32, head dims 32, few heads. CUDA: bf16, the M3 TP4
shapes (16 query heads : 1 KV head, D 128, block 128, top-16).
"""
from dataclasses import dataclass

import torch

from m3lab.arith import ceil_div
from ..kernels.indexer import launcher as index_launcher
from ..kernels.indexer import reference as index_ref
from ..kernels.sparse_attn import launcher as attn_launcher
from ..kernels.sparse_attn import reference as attn_ref
from .checks import poison_
from .registry import Case, Gate, register

FP8 = torch.float8_e4m3fn


@dataclass
class PagedProblem:
    """Varlen metadata (int32): block_tables [R, W], seq_lens [R], cu_seqlens_q [R+1]; row_req, q_pos [T];
    caches: k_blocks, v_blocks [NB, block, Hkv, D], index_cache [NB, block, Di]; queries q [T, Hq, D], iq [T, Hi, Di]."""
    lens: list[int]
    q_lens: list[int]
    block: int
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    row_req: torch.Tensor
    q_pos: torch.Tensor
    k_blocks: torch.Tensor
    v_blocks: torch.Tensor
    index_cache: torch.Tensor
    q: torch.Tensor
    iq: torch.Tensor

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5

    def rows(self, r: int) -> slice:
        return slice(int(self.cu_seqlens_q[r]), int(self.cu_seqlens_q[r + 1]))

    def keys(self, cache: torch.Tensor, r: int) -> torch.Tensor:
        """Request r's written entries of a paged cache, in position order: [len, ...]."""
        n = ceil_div(self.lens[r], self.block)
        return cache[self.block_tables[r, :n].long()].flatten(0, 1)[:self.lens[r]]


def paged_problem(lens, q_lens, *, block: int, kv_heads: int, group: int, head_dim: int, index_dim: int,
                  dtype: torch.dtype, device, kv_dtype: torch.dtype | None = None,
                  index_dtype: torch.dtype | None = None, spare: int = 3) -> PagedProblem:
    """Fresh random problem (see the module doc); kv_dtype / index_dtype fp8: e4m3 caches of random values."""
    r = len(lens)
    nblk = [ceil_div(n, block) for n in lens]
    width = max(nblk)
    total = sum(nblk) + spare
    perm = torch.randperm(total, device=device).to(torch.int32)
    bt = torch.zeros(r, width, dtype=torch.int32, device=device)
    written = torch.zeros(total * block, dtype=torch.bool, device=device)
    used = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[used:used + n]
        used += n
        slots = bt[i, :n].long()[:, None] * block + torch.arange(block, device=device)
        written[slots.flatten()[:lens[i]]] = True

    def cache(*shape, dt):
        x = torch.randn(total, block, *shape, device=device)
        x = x.view(total * block, *shape).masked_fill(~written.view(-1, *([1] * len(shape))), float("nan"))
        return x.view(total, block, *shape).to(dt)

    kvd = kv_dtype or dtype
    t = sum(q_lens)
    return PagedProblem(
        list(lens), list(q_lens), block, bt, torch.tensor(lens, dtype=torch.int32, device=device),
        torch.tensor([0] + list(torch.cumsum(torch.tensor(q_lens), 0)), dtype=torch.int32, device=device),
        torch.repeat_interleave(torch.arange(r, device=device), torch.tensor(q_lens, device=device)),
        torch.cat([torch.arange(n - q, n, device=device) for n, q in zip(lens, q_lens)]),
        cache(kv_heads, head_dim, dt=kvd), cache(kv_heads, head_dim, dt=kvd),
        cache(index_dim, dt=index_dtype or dtype),
        torch.randn(t, kv_heads * group, head_dim, device=device).to(dtype),
        torch.randn(t, kv_heads, index_dim, device=device).to(dtype))


def selection_ref(p: PagedProblem, *, topk: int, local_blocks: int = 1, init_blocks: int = 0) -> torch.Tensor:
    """Reference top-k of every row: int32 [Hi, T, topk] (index_ref on each request's keys)."""
    out = []
    for r in range(len(p.lens)):
        rows = p.rows(r)
        out.append(index_ref.indexer_topk_ref(p.iq[rows], p.keys(p.index_cache, r), p.q_pos[rows],
                                              block_size=p.block, topk=topk, local_blocks=local_blocks,
                                              init_blocks=init_blocks))
    return torch.cat(out, dim=1)


def block_scores_ref(p: PagedProblem) -> list[torch.Tensor]:
    """Per request, fp32 block-max scores [Hi, q_len, blocks] (-inf where not visible)."""
    return [index_ref.block_max(index_ref.index_scores(p.iq[p.rows(r)], p.keys(p.index_cache, r),
                                                       p.q_pos[p.rows(r)]), p.block) for r in range(len(p.lens))]


def attention_ref(p: PagedProblem, blocks: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Dense masked reference over each request's written keys (fp32): blocks [Hkv, T, K] -> [T, Hq, D]."""
    outs = []
    for r in range(len(p.lens)):
        rows = p.rows(r)
        k = p.keys(p.k_blocks, r).float() * k_scale
        v = p.keys(p.v_blocks, r).float() * v_scale
        outs.append(attn_ref.masked_dense_attention_ref(p.q[rows].float(), k, v, blocks[:, rows], p.q_pos[rows],
                                                        block_size=p.block, scale=p.scale))
    return torch.cat(outs)


def sorted_ids(topk: torch.Tensor) -> torch.Tensor:
    """Selections compared as sets: ids sorted per row (-1 last)."""
    big = torch.iinfo(torch.int32).max
    return torch.where(topk < 0, big, topk).sort(-1).values


# --- our kernels' gates ------------------------------------------------------------------------------------------
def _setup(device: torch.device):
    if device.type == "cuda":
        return dict(block=128, kv_heads=1, group=16, head_dim=128, index_dim=128, dtype=torch.bfloat16), \
            [([9000, 70000, 1500, 130], 1), ([33000, 2100], 4), ([8192, 3000], 96)], 16
    return dict(block=16, kv_heads=2, group=3, head_dim=32, index_dim=32, dtype=torch.float32), \
        [([37, 200, 9], 1), ([150, 70], 3), ([70, 40], 9)], 4


def _label(lens, ql, extra=""):
    return f"lens={'/'.join(map(str, lens))},q={ql}{extra}"


def _index_case(device, lens, ql, topk, index_dtype=None) -> Case:
    kw, _, _ = _setup(device)

    def run():
        p = paged_problem(lens, [ql] * len(lens), device=device, index_dtype=index_dtype, **kw)
        out = index_launcher.Selection(poison_(torch.empty(kw["kv_heads"], p.q.shape[0], topk, dtype=torch.int32,
                                                           device=device)))
        got = index_launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q,
                                          topk=topk, shared=out)
        ref_p = p if index_dtype is None else _upcast_index(p, kw["dtype"])
        return sorted_ids(got.topk), sorted_ids(selection_ref(ref_p, topk=topk))
    name = _label(lens, ql, ",fp8_index" if index_dtype else "")
    return Case(name, "int32", run, exact=True)


def _upcast_index(p: PagedProblem, dtype) -> PagedProblem:
    import dataclasses
    return dataclasses.replace(p, index_cache=p.index_cache.to(dtype))


def _attn_case(device, lens, ql, topk, layout: str, kv_dtype=None) -> Case:
    kw, _, _ = _setup(device)
    dt = str(kw["dtype"]).removeprefix("torch.")

    def run():
        p = paged_problem(lens, [ql] * len(lens), device=device, kv_dtype=kv_dtype, **kw)
        blocks = selection_ref(p, topk=topk)
        ks = vs = None
        if kv_dtype is not None:
            ks = torch.tensor([0.7], device=device)
            vs = torch.tensor([1.3], device=device)
        out = poison_(torch.empty_like(p.q))
        if layout == "triton":
            kp, vp = attn_ref.triton_planes(attn_ref.triton_kv_cache(p.k_blocks, p.v_blocks))
            attn_launcher.sparse_attention(p.q, kp, vp, blocks, p.block_tables, p.seq_lens, p.cu_seqlens_q,
                                           scale=p.scale, k_scale=ks, v_scale=vs, out=out, max_q_len=ql,
                                           uniform_rows=True)
        else:
            kv16, vv16, stride = attn_ref.aiter_page16_cache(p.k_blocks, p.v_blocks)
            table, ctx = [], []
            for h in range(blocks.shape[0]):
                tb, cx = attn_ref.sparse_page_table_ref(blocks[h].cpu(), p.block_tables.cpu(), p.row_req.cpu(),
                                                        p.q_pos.cpu(), block_size=p.block, block_page_stride=stride)
                table.append(tb)
                ctx.append(cx)
            attn_launcher.page16_attention(p.q, kv16, vv16, torch.stack(table).to(device),
                                           torch.stack(ctx).to(device), scale=p.scale, block_size=p.block,
                                           k_scale=ks, v_scale=vs, out=out)
        return out, attention_ref(p, blocks, 0.7 if kv_dtype else 1.0, 1.3 if kv_dtype else 1.0)
    return Case(_label(lens, ql, f",{layout}" + (",fp8_kv" if kv_dtype else "")), dt, run)


def _table_case(device, lens, ql, topk) -> Case:
    kw, _, _ = _setup(device)
    kw = {**kw, "kv_heads": 1, "block": 128 if device.type == "cuda" else 32}

    def run():
        p = paged_problem(lens, [ql] * len(lens), device=device, **kw)
        t = p.q.shape[0]
        sel = index_launcher.Selection(*(poison_(torch.empty(*shape, dtype=torch.int32, device=device))
                                         for shape in ((1, t, topk), (1, t, topk * p.block // 16), (1, t))))
        index_launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q,
                                    topk=topk, emit_page_table=True, shared=sel)
        tb, cx = attn_ref.sparse_page_table_ref(sel.topk[0].cpu(), p.block_tables.cpu(), p.row_req.cpu(),
                                                p.q_pos.cpu(), block_size=p.block, block_page_stride=p.block // 8)
        return torch.cat([sel.table[0].cpu(), sel.ctx[0].cpu()[:, None]], 1), torch.cat([tb, cx[:, None]], 1)
    return Case(_label(lens, ql), "int32", run, exact=True)


def _cases(kind: str, device: torch.device):
    _, shapes, topk = _setup(device)
    for lens, ql in shapes:
        if kind == "indexer":
            yield _index_case(device, lens, ql, topk)
            if ql == 1:
                yield _index_case(device, lens, ql, topk, index_dtype=FP8)
        elif kind == "page_table":
            yield _table_case(device, lens, ql, topk)
        else:
            yield _attn_case(device, lens, ql, topk, kind)
            if ql < 8:
                yield _attn_case(device, lens, ql, topk, kind, kv_dtype=FP8)


register(Gate("sparse.indexer", "sparse_indexer", lambda d: list(_cases("indexer", d)),
              doc="indexer scores + top-k (bf16/fp8 index keys) vs the reference selection (as sets)"))
register(Gate("sparse.page_table", "sparse_indexer", lambda d: list(_cases("page_table", d)),
              doc="the page-16 table the top-k kernel emits vs sparse_page_table_ref (exact)"))
register(Gate("sparse.attn_triton", "sparse_attn", lambda d: list(_cases("triton", d)),
              doc="sparse attention on vLLM's Triton layout (bf16/fp8 KV) vs the dense masked reference"))
register(Gate("sparse.attn_page16", "sparse_attn", lambda d: list(_cases("page16", d)),
              doc="sparse attention through the page adapter on AITER's page-16 views vs the dense masked reference"))
