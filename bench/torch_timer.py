"""bench/torch_timer.py: how the PyTorch baselines time GPU work, the way bench_common.h times
fusegrad's: CUDA events around the work, the median of `reps` repetitions after `warmup`, L2
flushed before each (a buffer of twice its size zeroed), and the host's launches queued while the
GPU spins before the start event, so that the events time the GPU's work and not Python's or
torch.compile's cost of launching it.
"""
import statistics

import torch

HOST_LEAD_CYCLES = 2_000_000  # GPU clock cycles the GPU spins: about 1 ms at 2 GHz


class Timer:
    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")

    def median_ms(self, fn, reps=30, warmup=3):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            self.flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(HOST_LEAD_CYCLES)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return statistics.median(times)
