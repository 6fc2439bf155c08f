"""Device telemetry over a timed window: GPU power, utilisation, memory and SM clock from NVML
(``nvml``), CPU package energy from RAPL (``rapl``), both read by one sampler (``sampler``)::

    with TelemetrySampler(device) as s:
        ...  # the timed work, ending with a device synchronisation
    energy = s.summary()  # for the record's metrics block
    trace = s.trace()     # GPU readings over time

Telemetry never fails or slows a run noticeably: a source that is missing (no NVIDIA GPU, no
``pynvml``, no driver, no RAPL, counters not readable) is recorded as unavailable with its
reason, and its figures are None, never 0, which would read as a measurement. Both sources see
the whole device: other processes on the GPU or CPU packages count too.
"""

from hpcdl.measure.telemetry.nvml import TRACE_KEYS, NvmlGpu
from hpcdl.measure.telemetry.rapl import RaplCounter
from hpcdl.measure.telemetry.sampler import TelemetrySampler

__all__ = ["TRACE_KEYS", "NvmlGpu", "RaplCounter", "TelemetrySampler"]
