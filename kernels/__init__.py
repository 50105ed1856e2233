"""Triton kernels for MIA Engine, each beside the plain torch reference it is tested against."""
