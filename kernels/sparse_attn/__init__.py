"""Sparse GQA attention of MiniMax M3 over the indexer's selected KV blocks."""
