"""torch_npu.npu.mstx of the emulated NPU: the profiler's range markers (NVTX's counterpart), no-ops as on an NPU with
no profiler recording them. range_push/range_pop return depth 0, range_start handle 0."""

from __future__ import annotations

import contextlib
from typing import Any

from npu_port_emulation.target import NoMarkers

_markers = NoMarkers()
mark = _markers.mark
range_push = _markers.range_push
range_pop = _markers.range_pop
range_start = _markers.range_start
range_end = _markers.range_end


class annotate(contextlib.ContextDecorator):  # noqa: N801  (torch_npu's name)
    """`with mstx.annotate("step"):` or `@mstx.annotate("step")`: marks nothing."""

    def __init__(self, message: str = "", *args: Any, **kwargs: Any) -> None:
        self.message = message

    def __enter__(self) -> "annotate":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None
