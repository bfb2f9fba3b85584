"""MX (OCP Microscaling v1.0) quantisation: reference.py (torch) and triton_mx.py (Triton)."""
