"""MiniMax M3 MoE: sigmoid+bias router, top-k, grouped expert GEMMs, SwiGLU-OAI."""
