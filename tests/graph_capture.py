"""CUDA-graph capture for the GPU tests (importable: ``tests`` is on pytest's python path)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture(fn: Callable[[], object], forbid_sync: bool = False) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn``, after one warm-up call on a side stream (compilation happens
    outside the capture). With ``forbid_sync`` the capture runs under
    ``torch.cuda.set_sync_debug_mode("error")``: a host sync inside ``fn`` raises."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    if forbid_sync:
        torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            fn()
    finally:
        if forbid_sync:
            torch.cuda.set_sync_debug_mode(0)
    return graph
