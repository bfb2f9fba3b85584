"""Index helpers for ragged batches shared by the attention-side kernels (kernels/indexer, kernels/sparse_attn).

A batch holds requests of different query lengths back to back: request r owns the flat tokens
``cu_q[r] .. cu_q[r+1]`` and has ``seq_lens[r]`` tokens of context including them, so its queries are the last
``q_len`` positions of its sequence.
"""
import triton
import triton.language as tl


@triton.jit
def query_row(cu_q_ptr, seq_lens_ptr, r, i):
    """Query i of request r -> (q_len, t, pos): the request's query count, the flat token index
    ``t = cu_q[r] + i`` (int64) and the token's position in its sequence ``pos = seq_lens[r] - q_len + i``.
    Meaningful for i < q_len only: a program with i >= q_len returns."""
    q0 = tl.load(cu_q_ptr + r)
    q_len = tl.load(cu_q_ptr + r + 1) - q0
    t = (q0 + i).to(tl.int64)
    pos = tl.load(seq_lens_ptr + r) - q_len + i
    return q_len, t, pos
