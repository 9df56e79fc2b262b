"""Sparse Binary Compression (Sattler et al., arXiv 1805.08768): top-k sparsification, binarization, Golomb positions."""
