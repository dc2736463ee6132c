"""bench/torch_timer.py: how the PyTorch baselines time GPU work, the way bench_common.h times
fusegrad's: CUDA events around the work, the median of `reps` repetitions after `warmup`, L2
flushed before each (a buffer of twice its size zeroed), and the host's launches queued while the
GPU spins before the start event, so that the events time the GPU's work and not Python's or
torch.compile's cost of launching it. Where the spin is too short for that (the GPU reached the
start event before the host finished launching), the timer lengthens it and repeats.
"""
import statistics

import torch

HOST_LEAD_CYCLES = 2_000_000  # GPU clock cycles the GPU spins: about 1 ms at 2 GHz
MAX_LEAD_CYCLES = 128_000_000  # the most it spins: about 64 ms


class Timer:
    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
        self.lead = HOST_LEAD_CYCLES
        self.host_bound = 0  # repetitions kept although the host was still launching

    def median_ms(self, fn, reps=30, warmup=3):
        """The median GPU time of fn(). A repetition whose start event the GPU reached before
        the host had queued all of fn's work (the spin was too short for the host's cost of
        launching it, so the events would time the host) is done again with twice the spin, up to
        MAX_LEAD_CYCLES; past that it is kept and counted in self.host_bound."""
        for _ in range(warmup):
            fn()
        times = []
        while len(times) < reps:
            self.flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(self.lead)
            start.record()
            fn()
            reached = start.query()  # the GPU is past the spin while the host still launched
            stop.record()
            stop.synchronize()
            if reached and self.lead < MAX_LEAD_CYCLES:
                self.lead *= 2
                continue
            self.host_bound += int(reached)
            times.append(start.elapsed_time(stop))
        return statistics.median(times)
