"""Inductor settings for a test's own compile in its process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def lookups_seen(**patch: Any) -> Iterator[None]:
    """Inductor config ``patch`` for a compile that must make its GEMM lookups (a cache hit skips the
    lowering): the FX graph, AOTAutograd and autotune caches and Dynamo's profile-guided dynamic shapes
    off, as ``force_disable_caches`` turns them off, but Inductor's kernel cache on, as a tune compiles
    (zhantune.inductor.settings.KERNEL_CACHE_PATCH): a kernel built before, by this test or another,
    loads in 0.2 s where force_disable_caches built it again in 1.5 s. A tune's own settings: its
    KERNEL_CACHE_PATCH and zhantune.bench.inductor's _no_graph_caches."""
    from torch._inductor import config as inductor_config

    from zhantune.bench.inductor import _no_graph_caches
    from zhantune.inductor.settings import KERNEL_CACHE_PATCH

    with inductor_config.patch({**KERNEL_CACHE_PATCH, **patch}), _no_graph_caches():
        yield
