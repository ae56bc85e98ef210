"""Zeroed CPU tensors on 2 MiB pages, for the KV pools the decode attention kernel reads block by block.

A KV block of one head is a few KiB somewhere in a pool of hundreds of MiB, so nearly every block a decode step
reads lies on a 4 KiB page the TLB has not seen, and on a virtual machine each such miss walks two page tables.
On the 2-vCPU EPYC VM the decode attention kernel over 64 contexts of 100-300 tokens was 1.07-1.12x faster on
2 MiB pages than on 4 KiB ones (benchmarks/kv_huge_pages.py; 1.05-1.26x over three runs), and torch read 256 MiB
at 62 GB/s against 39 in one measurement; whole decode steps moved by less than that VM's noise
(benchmarks/README.md, "KV pools on 2 MiB pages").

Linux gives an anonymous mapping 2 MiB pages where transparent huge pages are `always`, or `madvise` (most
distributions' default) and the range is advised with MADV_HUGEPAGE; this module maps the pool itself, advises it
and touches it once, so the pages are taken at start-up, not during a step. Where none can be had (THP `never`,
fragmented memory, another OS) the same call gives ordinary pages: only the speed differs. Torch's own
THP_MEM_ALLOC_ENABLE would advise every large allocation instead; measured, that made prefills slower (their
activations then fault in 2 MiB pages each step), so only the pools are placed this way.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys

import torch

HUGE_PAGE = 2 * 1024 * 1024
"""Bytes of one transparent huge page on x86-64 and most arm64 kernels."""

HUGE_CACHE_MIN = 512 * 2**20
"""The smallest KV cache (all its pools together, in bytes) placed on 2 MiB pages; a smaller one gets ordinary pages.

A trade measured on the 2-vCPU EPYC VM (benchmarks/README.md, "Small KV caches back on ordinary pages"). Gain: the
decode kernel over 64 contexts ran 1.15-1.26x faster on 2 MiB pages in float32 and 1.01x in bfloat16; whole decode
steps at batch 64, with caches of 0.8-1.6 GiB, 1.04x. Cost, at every engine start: faulting in a 2 MiB page took
3.3-11 ms in most measurements, where 4 KiB pages filled at 4-5 GiB/s (0.4-0.5 ms per 2 MiB). Small caches are the
gates' and tests' short-lived engines, where start-up outweighs a few percent of step time: the quickstart's
`gate check`, whose engines hold 64 MiB caches, took 25-26 s on huge pages and 19-21 s without.
"""


def huge_page_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor of `shape` whose memory is advised for 2 MiB pages, already faulted in.

    Smaller than one huge page, or where the kernel has no MADV_HUGEPAGE, it is plain `torch.zeros`. Callers decide
    whether a tensor is worth it (`wants_huge_pages`).
    """
    nbytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advice is None or not sys.platform.startswith("linux"):
        return torch.zeros(shape, dtype=dtype)
    # private and anonymous (a shared mapping would be shmem, under other THP rules); zero-filled; the slack lets
    # the start be aligned
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    offset = -address % HUGE_PAGE
    try:
        region.madvise(advice, offset, nbytes)
    except OSError:
        pass  # THP compiled out of this kernel: ordinary pages, same contents
    # the tensor holds a reference to the mapping, which lives as long as any view of the pool
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=offset)
    flat.zero_()  # fault every page in now, at start-up, not in a step's first write to it
    return flat.view(dtype).view(shape)


def wants_huge_pages(cache_bytes: int, device: torch.device | str) -> bool:
    """Whether a KV cache of `cache_bytes` on `device` goes on 2 MiB pages: on CPU, from HUGE_CACHE_MIN up."""
    return torch.device(device).type == "cpu" and cache_bytes >= HUGE_CACHE_MIN
